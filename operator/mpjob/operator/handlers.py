"""kopf handlers: observe the cluster, ask mpjob.planning.reconcile what to do, do it.

Every trigger (the CR changed, an attempt Job changed, the operator's periodic ticker) runs the same
level-triggered `reconcile_job`, serialized per MixedPrecisionJob. Status is written before
children are created, so the status stays the operator's memory across restarts.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from mpjob.builders.attempt import LABEL_ATTEMPT, LABEL_JOB, TRAINER_CONTAINER, attempt_job, attempt_service
from mpjob.operator import metrics as om
from mpjob.planning import status as st
from mpjob.planning.reconcile import FINISHED, JobView, PodView, reconcile
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
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: Container waiting reasons that mean the pod will never run.
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
#: Job conditions that end an attempt's Job, as the Complete/Failed they lead to.
TERMINAL_CONDITIONS = {
    "Complete": "Complete",
    "SuccessCriteriaMet": "Complete",
    "Failed": "Failed",
    "FailureTarget": "Failed",
}

_locks: dict[tuple[str, str], threading.Lock] = defaultdict(threading.Lock)
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


# ------------------------------------------------------------------ observing


def _raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A call's JSON as plain dicts: the client's typed models cost several milliseconds of
    CPU per object, the operator's largest cost at hundreds of jobs."""
    response = call(*args, _preload_content=False, **kwargs)
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()


def _pod_view(pod: dict[str, Any]) -> PodView:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    statuses = [c for c in status.get("containerStatuses") or [] if c.get("name") == TRAINER_CONTAINER]
    state = (statuses[0].get("state") or {}) if statuses else {}
    terminated, waiting = state.get("terminated"), state.get("waiting")
    phase = status.get("phase") or "Pending"
    platform = status.get("reason")  # Evicted, NodeLost, ...
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True" and not platform:
            platform = cond.get("reason") or "DisruptionTarget"
    if terminated is not None and terminated.get("reason") == "OOMKilled":
        platform = "OOMKilled"
    if waiting is not None and waiting.get("reason") in IMAGE_ERRORS:
        platform = waiting["reason"]
    return PodView(
        name=meta.get("name", ""),
        index=int(annotations.get(COMPLETION_INDEX, "0")),
        phase=phase,
        alive=phase in ("Pending", "Running", "Unknown") and terminated is None and platform not in IMAGE_ERRORS,
        exit_code=terminated.get("exitCode") if terminated is not None else None,
        termination_message=terminated.get("message") if terminated is not None else None,
        platform_reason=platform,
        deleting=meta.get("deletionTimestamp") is not None,
    )


@dataclass(frozen=True)
class Observed:
    jobs: dict[int, JobView]
    lingering: frozenset[int]  # attempts whose Job is gone but some pod still runs
    rank0_ip: dict[int, str]  # attempt -> the running rank-0 pod's IP (its metrics endpoint)


def observe(namespace: str, name: str) -> Observed:
    _, batch, core = _api()
    selector = f"{LABEL_JOB}={name}"
    pods_by_attempt: dict[int, list[PodView]] = defaultdict(list)
    rank0_ip: dict[int, str] = {}
    for pod in _raw(core.list_namespaced_pod, namespace, label_selector=selector)["items"]:
        index = int((pod["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "-1"))
        view = _pod_view(pod)
        pods_by_attempt[index].append(view)
        ip = (pod.get("status") or {}).get("podIP")
        if view.index == 0 and view.phase == "Running" and view.alive and ip:
            rank0_ip[index] = ip
    jobs: dict[int, JobView] = {}
    for job in _raw(batch.list_namespaced_job, namespace, label_selector=selector)["items"]:
        index = int((job["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "-1"))
        finished = reason = None
        for cond in (job.get("status") or {}).get("conditions") or []:
            # FailureTarget / SuccessCriteriaMet come first: the Job controller has decided and
            # starts no more pods; the planner still waits for every pod to stop.
            kind = TERMINAL_CONDITIONS.get(cond.get("type"))
            if kind and cond.get("status") == "True" and finished is None:
                finished, reason = kind, cond.get("reason")
        jobs[index] = JobView(
            index=index,
            finished=finished,
            reason=reason,
            pods=tuple(pods_by_attempt.get(index, [])),
            suspended=bool((job.get("spec") or {}).get("suspend")),
        )
    lingering = frozenset(i for i, pods in pods_by_attempt.items() if i not in jobs and any(p.alive for p in pods))
    return Observed(jobs, lingering, rank0_ip)


# ------------------------------------------------------------------ acting


def _create(kind: str, obj: dict[str, Any], owner: dict[str, Any], namespace: str) -> None:
    _, batch, core = _api()
    kopf.adopt(obj, owner=owner)
    try:
        if kind == "Service":
            _raw(core.create_namespaced_service, namespace, obj)
        else:
            created = _raw(batch.create_namespaced_job, namespace, obj)
            # The Job's ADDED event would only show what this reconcile just decided.
            _job_signatures[created["metadata"]["uid"]] = job_signature(created)
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
    with _locks[(namespace, name)], om.RECONCILE_SECONDS.time():
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
        # Every attempt is in the status before its Job exists: with none recorded there is
        # nothing to observe (this saves two list calls per new job).
        seen = observe(namespace, name) if old.attempts else Observed({}, frozenset(), {})
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
                    name,
                    namespace,
                    spec,
                    start.index,
                    start.precision,
                    start.resume_from,
                    TRAINER_IMAGE,
                    deadline,
                    TRAINER_COMMAND,
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


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def watched_jobs(namespace: str, name: str, status: dict[str, Any], spec: dict[str, Any], **_: Any) -> Any:
    """Every MixedPrecisionJob this operator serves, and whether the ticker still has work on it.
    An index needs no finalizer (a kopf timer would put one on every job)."""
    phase = (status or {}).get("phase")
    ttl = (spec.get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    return {(namespace, name): phase not in FINISHED or ttl is not None}


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, watched_jobs: kopf.Index, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="mpjob.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="mpjob.dev")
    # Only warnings become Events: kopf would otherwise post one per handler run ("Handler ...
    # succeeded"), an API write each; the job's own Events go through kopf.event.
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 120
    settings.execution.max_workers = int(os.environ.get("MPJOB_WORKERS", "16"))
    _api()
    _ticker_tasks.append(asyncio.create_task(_ticker(watched_jobs, settings.execution.max_workers)))


@kopf.on.cleanup()
async def stop_ticker(**_: Any) -> None:
    for task in _ticker_tasks:
        task.cancel()
    _ticker_tasks.clear()


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL, field="spec")
def on_change(name: str, namespace: str, **_: Any) -> None:
    try:
        reconcile_job(namespace, name)
    except ApiException as exc:
        om.ERRORS.labels(kind=f"api{exc.status}").inc()
        raise kopf.TemporaryError(f"API error {exc.status}: {exc.reason}", delay=2) from exc


def job_signature(body: dict[str, Any]) -> tuple[Any, ...]:
    """What of an attempt Job's state the planner reads: anything else changing is not worth a
    reconcile (a Job sees several status writes per pod transition)."""
    status = body.get("status") or {}
    conditions = tuple(sorted((c.get("type"), c.get("status")) for c in status.get("conditions") or []))
    counts = tuple(status.get(k) for k in ("active", "succeeded", "failed", "terminating"))
    return conditions, counts, (body.get("spec") or {}).get("suspend")


_job_signatures: dict[str, tuple[Any, ...]] = {}


@kopf.on.event("batch", "v1", "jobs", labels={LABEL_JOB: kopf.PRESENT})
def on_attempt_job(
    labels: dict[str, str], namespace: str, type: str | None, body: dict[str, Any], uid: str, **_: Any
) -> None:
    if type is None:  # the initial listing; the CR handlers cover it
        return
    if type == "DELETED":
        _job_signatures.pop(uid, None)
    else:
        signature = job_signature(body)
        if _job_signatures.get(uid) == signature:
            return
        _job_signatures[uid] = signature
    try:
        reconcile_job(namespace, labels[LABEL_JOB])
    except ApiException as exc:
        om.ERRORS.labels(kind=f"api{exc.status}").inc()
        log.warning("reconcile after a Job event failed: %s", exc.reason)


# ------------------------------------------------------------------ the ticker

_ticker_tasks: list[asyncio.Task[None]] = []
#: Set by `mpjob operator` when kopf peering is on: {"name", "identity", "priority", "clusterwide"}.
PEERING: dict[str, Any] = {}


def peering_active(namespace: str) -> bool:
    """Whether this operator is the one kopf lets act (no live peer of equal or higher priority),
    read from the same peering object kopf keeps. Standalone operators are always active."""
    if not PEERING:
        return True
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


def tick_job(namespace: str, name: str) -> None:
    """The level-triggered safety net for one job, and its live progress."""
    started = time.monotonic()
    try:
        reconcile_job(namespace, name, progress=True)
    except ApiException as exc:
        om.ERRORS.labels(kind=f"api{exc.status}").inc()
        log.warning("tick of %s/%s failed after %.2fs: %s", namespace, name, time.monotonic() - started, exc.reason)


async def _ticker(index: kopf.Index, workers: int) -> None:
    """Tick each job that still has work once every TICK_SECONDS, spread evenly over the
    interval (never all at once: a burst of hundreds of reconciles would delay the event-driven
    ones behind it), at most MAX_TICKS_PER_SECOND and `workers` at a time in threads."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mpjob-tick")
    slots = asyncio.Semaphore(workers)

    async def tick_one(namespace: str, name: str) -> None:
        try:
            # kopf.event finds kopf's event queue through context variables, which a thread
            # pool does not carry over: run each tick in a copy of this task's context.
            await loop.run_in_executor(pool, contextvars.copy_context().run, tick_job, namespace, name)
        finally:
            slots.release()

    try:
        await asyncio.sleep(TICK_SECONDS)
        while True:
            started = loop.time()
            due = sorted(key for key, store in list(index.items()) if any(store))
            active: dict[str, bool] = {}
            for namespace in {ns for ns, _ in due}:
                active[namespace] = await loop.run_in_executor(
                    pool, contextvars.copy_context().run, peering_active, namespace
                )
            todo = [(ns, name) for ns, name in due if active[ns]]
            pace = max(TICK_SECONDS / max(len(todo), 1), 1 / MAX_TICKS_PER_SECOND)
            running: list[asyncio.Task[None]] = []
            for ns, name in todo:
                await slots.acquire()
                running.append(asyncio.create_task(tick_one(ns, name)))
                await asyncio.sleep(pace)
            await asyncio.gather(*running, return_exceptions=True)
            counts: dict[str, int] = defaultdict(int)
            for value in _phases.values():
                counts[value] += 1
            for phase_name in ("Pending", "Running", "Recovering", "Succeeded", "Failed", "Suspended"):
                om.JOBS_BY_PHASE.labels(phase=phase_name).set(counts.get(phase_name, 0))
            await asyncio.sleep(max(0.0, TICK_SECONDS - (loop.time() - started)))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def on_delete(body: dict[str, Any], **_: Any) -> None:
    """Children go with their owner (garbage collection); the checkpoint volume stays."""
    _phases.pop(body["metadata"]["uid"], None)
    _locks.pop((body["metadata"].get("namespace", ""), body["metadata"]["name"]), None)
