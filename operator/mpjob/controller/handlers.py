"""The operator: kopf watches the MixedPrecisionJobs, a cache watches their attempt Jobs and pods,
and a work queue runs the level-triggered `reconcile_job` for a job whose CR, Job or pods
changed, and for each job every TICK_SECONDS (the safety net and the live-progress read).

The queue never handles one job in two threads at once; status is written before children are
created, so the status stays the operator's memory across restarts.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import threading
import time
import urllib.request
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from mpjob.builders.attempt import attempt_job, attempt_service
from mpjob.controller import metrics as om
from mpjob.controller.cache import ChildCache, Key, Observed, raw
from mpjob.controller.workqueue import Retry, WorkQueue
from mpjob.planning import status as st
from mpjob.planning.reconcile import FINISHED, reconcile
from mpjob_contract import api
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

log = logging.getLogger("mpjob.operator")

TRAINER_IMAGE = os.environ.get("MPJOB_TRAINER_IMAGE", "mpjob-trainer:0.1.0")
TICK_SECONDS = float(os.environ.get("MPJOB_TICK_SECONDS", "5"))
#: The ticker's ceiling: with many jobs a round takes longer than TICK_SECONDS rather than
#: crowding out the event-driven reconciles (attempt starts and ends never wait for it).
MAX_TICKS_PER_SECOND = float(os.environ.get("MPJOB_MAX_TICKS_PER_SECOND", "20"))
#: Trainer container command (JSON list). Only benchmarks and tests change it, to run a stand-in.
TRAINER_COMMAND: list[str] = json.loads(os.environ.get("MPJOB_TRAINER_COMMAND", '["mpjob-trainer"]'))
#: How long a reconcile that failed on an API error waits before it is tried again.
RETRY_SECONDS = 2.0
#: The namespaces the operator serves (set by `mpjob operator`; empty: every namespace).
NAMESPACES: list[str] = []

_phases: dict[str, str] = {}
_clients: dict[str, Any] = {}


def _api() -> tuple[client.CustomObjectsApi, client.BatchV1Api, client.CoreV1Api]:
    if not _clients:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        _clients["custom"] = client.CustomObjectsApi()
        _clients["batch"] = client.BatchV1Api()
        _clients["core"] = client.CoreV1Api()
    return _clients["custom"], _clients["batch"], _clients["core"]


# ------------------------------------------------------------------ acting


def _create(kind: str, obj: dict[str, Any], owner: dict[str, Any], namespace: str) -> None:
    _, batch, core = _api()
    kopf.adopt(obj, owner=owner)
    try:
        if kind == "Service":
            raw(core.create_namespaced_service, namespace, obj)
        else:
            # Into the cache at once: the Job's ADDED event then changes nothing, and the next
            # reconcile sees the Job even before its event arrives.
            CACHE.record_job(raw(batch.create_namespaced_job, namespace, obj))
    except ApiException as exc:
        if exc.status != 409:  # AlreadyExists: a restarted operator re-derived the same attempt
            raise


def _delete_attempt(namespace: str, name: str) -> None:
    _, batch, core = _api()
    for call in (
        lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"),
        lambda: core.delete_namespaced_service(name, namespace),
    ):
        try:
            call()
        except ApiException as exc:
            if exc.status != 404:
                raise


def _patch_status(namespace: str, name: str, status: MixedPrecisionJobStatus) -> None:
    custom, _, _ = _api()
    custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status.to_api()}
    )


def reconcile_job(namespace: str, name: str, progress: bool = False) -> MixedPrecisionJobStatus | None:
    """Observe, decide, act for one MixedPrecisionJob. Safe to call from any trigger. With
    `progress`, a running attempt's live figures are read and written too, from the same
    observation."""
    custom, _, _ = _api()
    with om.RECONCILE_SECONDS.time():
        try:
            body = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        generation = body["metadata"].get("generation")
        old = MixedPrecisionJobStatus.model_validate(body.get("status") or {})
        try:
            spec = MixedPrecisionJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            if old.phase != "Failed":
                failed = old.model_copy(deep=True)
                failed.phase, failed.message = "Failed", f"invalid spec: {exc.errors()[0]['msg']}"
                st.set_condition(failed, "Failed", True, "InvalidSpec", failed.message, generation=generation)
                _patch_status(namespace, name, failed)
            return None
        seen = CACHE.observe(namespace, name) if old.attempts else Observed({}, frozenset(), {})
        plan = reconcile(spec, old, generation, seen.jobs, datetime.now(UTC), lingering=seen.lingering)
        if plan.status != old:
            _patch_status(namespace, name, plan.status)  # memory first, then act
        for index in plan.delete:
            _delete_attempt(namespace, f"{name}-a{index}")
        for start in plan.create:
            deadline = None
            if spec.run_policy.active_deadline_seconds and plan.status.start_time:
                begun = datetime.strptime(plan.status.start_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
                deadline = spec.run_policy.active_deadline_seconds - int((datetime.now(UTC) - begun).total_seconds())
            _create("Service", attempt_service(name, namespace, start.index, start.precision), body, namespace)
            _create(
                "Job",
                attempt_job(
                    job=name,
                    namespace=namespace,
                    spec=spec,
                    start=start,
                    image=TRAINER_IMAGE,
                    deadline_seconds=deadline,
                    trainer_command=TRAINER_COMMAND,
                ),
                body,
                namespace,
            )
        for reason in plan.started_reasons:
            om.ATTEMPTS_STARTED.labels(reason=reason).inc()
        for src, dst in plan.fallbacks:
            om.FALLBACKS.labels(from_precision=src, to_precision=dst).inc()
        for before, after in zip(old.attempts, plan.status.attempts, strict=False):
            if before.reason is None and after.reason is not None:
                om.ATTEMPTS_ENDED.labels(reason=after.reason).inc()
        for event in plan.events:
            kopf.event(body, type=event.type, reason=event.reason, message=event.message)
        _phases[body["metadata"]["uid"]] = plan.status.phase
        if progress and plan.status.phase == "Running" and not plan.create:
            ip = seen.rank0_ip.get(plan.status.attempt or 0)
            if ip:
                _write_progress(namespace, name, plan.status, scrape_progress(ip))
        return plan.status


# ------------------------------------------------------------------ live progress


def scrape_progress(ip: str) -> dict[str, Any]:
    """Read rank 0's metrics endpoint (the trainer holds no Kubernetes token)."""
    url = f"http://{ip}:{tm.DEFAULT_METRICS_PORT}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read().decode()
    except OSError:
        om.SCRAPE_FAILURES.inc()
        return {}
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    found: dict[str, Any] = {}
    for key, metric, cast in (
        ("step", tm.STEP, int),
        ("loss", tm.LOSS, float),
        ("lossScale", tm.LOSS_SCALE, float),
        ("overflowSteps", tm.OVERFLOW_STEPS + "_total", int),
        ("samplesPerSecond", tm.SAMPLES_PER_SECOND, float),
    ):
        if metric in values:
            found[key] = cast(values[metric])
    if tm.START_STEP in values:
        found["startStep"] = int(values[tm.START_STEP])
    if tm.LAST_GOOD_CHECKPOINT_STEP in values and values[tm.LAST_GOOD_CHECKPOINT_STEP] > 0:
        found["lastCheckpointStep"] = int(values[tm.LAST_GOOD_CHECKPOINT_STEP])
    return found


def _write_progress(namespace: str, name: str, status: MixedPrecisionJobStatus, found: dict[str, Any]) -> None:
    """Patch the live figures the trainer reported into the status, when they changed."""
    if not found:
        return
    custom, _, _ = _api()
    patch: dict[str, Any] = {k: v for k, v in found.items() if k not in ("lastCheckpointStep", "startStep")}
    if "startStep" in found and status.attempts and status.attempts[-1].start_step != found["startStep"]:
        # The trainer decides where it resumes (the newest valid checkpoint): record that.
        attempts = [a.to_api() for a in status.attempts]
        attempts[-1]["startStep"] = found["startStep"]
        patch["attempts"] = attempts
    if "lastCheckpointStep" in found and (
        not status.last_checkpoint or status.last_checkpoint.step < found["lastCheckpointStep"]
    ):
        patch["lastCheckpoint"] = {
            "step": found["lastCheckpointStep"],
            "precision": status.precision or "",
            "sha256": "",
            "path": "",
        }
    current = status.to_api()
    if any(current.get(k) != v for k, v in patch.items()):
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": patch}
        )


# ------------------------------------------------------------------ kopf wiring


def _handle(key: Key, tick: bool) -> None:
    """A work queue item: reconcile one job (with its live progress when the ticker asked)."""
    namespace, name = key
    CACHE.wait_synced()  # as controllers wait for their informers: never plan from half a listing
    _CONTEXT_READY.wait()  # kopf.event works only in a context kopf has set up (below)
    if not peering_active(namespace):
        return  # a standby: kopf's own watch is paused too; the ticker comes back to the job
    started = time.monotonic()
    try:
        # kopf.event finds kopf's event queue through context variables, which threads do
        # not carry over: each reconcile runs in a copy of the context kopf handles jobs in.
        _CONTEXT[0].copy().run(reconcile_job, namespace, name, tick)
    except ApiException as exc:
        om.ERRORS.labels(kind=f"api{exc.status}").inc()
        log.warning(
            "reconcile of %s/%s failed after %.2fs: %s", namespace, name, time.monotonic() - started, exc.reason
        )
        raise Retry(RETRY_SECONDS) from exc
    except Exception as exc:
        om.ERRORS.labels(kind=type(exc).__name__).inc()
        log.exception("reconcile of %s/%s failed", namespace, name)
        raise Retry(RETRY_SECONDS) from exc


def _enqueue(key: Key) -> None:
    QUEUE.add(key)


CACHE = ChildCache(changed=_enqueue)
QUEUE: WorkQueue  # made at startup
_CONTEXT: list[contextvars.Context] = [contextvars.copy_context()]
_CONTEXT_READY = threading.Event()


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def watched_jobs(namespace: str, name: str, status: dict[str, Any], spec: dict[str, Any], **_: Any) -> Any:
    """Every MixedPrecisionJob this operator serves, and whether the ticker still has work on it.
    An index needs no finalizer (a kopf timer would put one on every job)."""
    return {(namespace, name): _due(status, spec)}


def _due(status: dict[str, Any] | None, spec: dict[str, Any] | None) -> bool:
    ttl = ((spec or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    return (status or {}).get("phase") not in FINISHED or ttl is not None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, watched_jobs: kopf.Index, **_: Any) -> None:
    # Only warnings become Events: kopf would otherwise post one per handler run; the job's own
    # Events go through kopf.event.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    global QUEUE
    QUEUE = WorkQueue(_handle, workers=int(os.environ.get("MPJOB_WORKERS", "16")))
    om.QUEUE_DEPTH.set_function(QUEUE.__len__)
    _custom, batch, core = _api()
    CACHE.start(NAMESPACES or [None], batch, core)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, CACHE.wait_synced)
    _ticker_tasks.append(asyncio.create_task(_ticker(watched_jobs)))


@kopf.on.cleanup()
async def stop_ticker(**_: Any) -> None:
    for task in _ticker_tasks:
        task.cancel()
    _ticker_tasks.clear()
    CACHE.stop()
    QUEUE.close()


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def on_job_event(type: str | None, body: dict[str, Any], namespace: str, name: str, **_: Any) -> None:
    """Queue a reconcile when a job is new or its spec changed (the generation is ahead of
    status.observedGeneration), and for every unfinished job in kopf's first listing. The
    operator's own status writes come back here too, and queue nothing."""
    # kopf sets the variables kopf.event needs for the processing of each object, not at
    # startup: the reconciles in the queue's threads run in a copy of this context.
    _CONTEXT[0] = contextvars.copy_context()
    _CONTEXT_READY.set()
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    if type == "DELETED":  # children go with their owner (garbage collection); volumes stay
        _phases.pop(meta.get("uid", ""), None)
        return
    if type is None:
        if _due(status, body.get("spec")):
            QUEUE.add((namespace, name))
    elif status.get("observedGeneration") != meta.get("generation"):
        QUEUE.add((namespace, name))


# ------------------------------------------------------------------ the ticker

_ticker_tasks: list[asyncio.Task[None]] = []
#: Set by `mpjob operator` when kopf peering is on: {"name", "identity", "priority", "clusterwide"}.
PEERING: dict[str, Any] = {}
#: How long a read of the peering object is trusted (the queue asks before each reconcile).
PEERING_CHECK_SECONDS = 1.0
_peering_seen: dict[str, tuple[float, bool]] = {}


def peering_active(namespace: str) -> bool:
    """Whether this operator is the one kopf lets act (no live peer of equal or higher priority),
    read from the same peering object kopf keeps, at most once a second per object. Standalone
    operators are always active."""
    if not PEERING:
        return True
    scope = "" if PEERING["clusterwide"] else namespace
    checked = _peering_seen.get(scope)
    if checked is not None and time.monotonic() - checked[0] < PEERING_CHECK_SECONDS:
        return checked[1]
    active = _read_peering(namespace)
    _peering_seen[scope] = (time.monotonic(), active)
    return active


def _read_peering(namespace: str) -> bool:
    custom, _, _ = _api()
    try:
        if PEERING["clusterwide"]:
            body = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", PEERING["name"])
        else:
            body = custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", PEERING["name"])
    except ApiException:
        return False  # cannot tell: leave the work to kopf's own handlers
    now = datetime.now(UTC)
    for identity, peer in (body.get("status") or {}).items():
        if identity == PEERING["identity"] or not isinstance(peer, dict):
            continue
        seen = datetime.fromisoformat(str(peer.get("lastseen", "1970-01-01T00:00:00+00:00")))
        alive = (now - seen).total_seconds() < float(peer.get("lifetime", 60))
        if alive and int(peer.get("priority", 0)) >= PEERING["priority"]:
            return False
    return True


async def _ticker(index: kopf.Index) -> None:
    """Queue a tick of each job that still has work once every TICK_SECONDS, spread evenly over
    the interval (never all at once), at most MAX_TICKS_PER_SECOND. Ticks wait behind changes."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(TICK_SECONDS)
    while True:
        started = loop.time()
        due = sorted(key for key, store in list(index.items()) if any(store))
        pace = max(TICK_SECONDS / max(len(due), 1), 1 / MAX_TICKS_PER_SECOND)
        for key in due:
            QUEUE.add(key, tick=True)
            await asyncio.sleep(pace)
        counts: dict[str, int] = defaultdict(int)
        for value in _phases.values():
            counts[value] += 1
        for phase_name in ("Pending", "Running", "Recovering", "Succeeded", "Failed", "Suspended"):
            om.JOBS_BY_PHASE.labels(phase=phase_name).set(counts.get(phase_name, 0))
        await asyncio.sleep(max(0.0, TICK_SECONDS - (loop.time() - started)))
