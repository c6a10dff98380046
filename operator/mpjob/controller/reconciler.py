"""One MixedPrecisionJob's reconcile: observe (the CR from the API server, its children from the
cache), decide (`mpjob.planning.reconcile`, pure), act (status first, then children, metrics,
Events), and on a tick record the running attempt's live progress from the same observation.

The work queue calls `Reconciler.handle` for a job key and never for one job in two threads at
once; the status is written before children are created, so it stays the operator's memory
across restarts.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from mpjob.builders.attempt import attempt_job, attempt_service
from mpjob.controller import metrics as om
from mpjob.controller.cache import ChildCache, Key, Observed
from mpjob.controller.cluster import Cluster
from mpjob.controller.config import OperatorConfig
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.progress import progress_patch, scrape_progress
from mpjob.controller.workqueue import Retry
from mpjob.planning import status as st
from mpjob.planning.lifecycle import Plan
from mpjob.planning.reconcile import reconcile
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

log = logging.getLogger("mpjob.operator")

#: The Failed condition's reason for a spec the models refuse (the CRD let it through).
NOTHING_SEEN = Observed({}, frozenset(), {})
T = TypeVar("T")


class KopfContext:
    """kopf.event finds kopf's event queue through context variables, which threads do not
    carry over, and kopf sets them for the processing of each object, not at startup: the
    handlers capture a context here and each reconcile runs in a copy of it."""

    def __init__(self) -> None:
        self._context = contextvars.copy_context()
        self._ready = threading.Event()

    def capture(self) -> None:
        """Keep the caller's context (a kopf handler's) for the reconciles to run in."""
        self._context = contextvars.copy_context()
        self._ready.set()

    def wait(self) -> None:
        """Until a kopf handler has captured its context."""
        self._ready.wait()

    def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call` in a copy of the captured context."""
        return self._context.copy().run(call, *args, **kwargs)


class Reconciler:
    def __init__(self, *, config: OperatorConfig, cluster: Cluster, cache: ChildCache, peering: PeeringCheck) -> None:
        self.config, self.cluster, self.cache, self.peering = config, cluster, cache, peering
        self.context = KopfContext()
        #: The phase each job's last reconcile left, by UID (the ticker publishes the counts).
        self.phases: dict[str, str] = {}

    def handle(self, key: Key, tick: bool) -> None:
        """A work queue item: reconcile one job (with its live progress when the ticker asked).
        A failure is counted, logged and retried after `retry_seconds`."""
        namespace, name = key
        self.cache.wait_synced()  # as controllers wait for their informers: never plan from half a listing
        self.context.wait()  # kopf.event works only in a context kopf has set up
        if not self.peering.active(namespace):
            return  # a standby: kopf's own watch is paused too; the ticker comes back to the job
        started = time.monotonic()
        try:
            self.context.run(self.reconcile, namespace, name, progress=tick)
        except ApiException as exc:
            om.ERRORS.labels(kind=f"api{exc.status}").inc()
            log.warning(
                "reconcile of %s/%s failed after %.2fs: %s", namespace, name, time.monotonic() - started, exc.reason
            )
            raise Retry(self.config.retry_seconds) from exc
        except Exception as exc:
            om.ERRORS.labels(kind=type(exc).__name__).inc()
            log.exception("reconcile of %s/%s failed", namespace, name)
            raise Retry(self.config.retry_seconds) from exc

    def reconcile(self, namespace: str, name: str, *, progress: bool = False) -> MixedPrecisionJobStatus | None:
        """Observe, decide, act for one MixedPrecisionJob. Safe to call from any trigger. With
        `progress`, a running attempt's live figures are read and written too."""
        with om.RECONCILE_SECONDS.time():
            body = self.cluster.read_job(namespace, name)
            if body is None:
                return None
            old = MixedPrecisionJobStatus.model_validate(body.get("status") or {})
            try:
                spec = MixedPrecisionJobSpec.model_validate(body.get("spec") or {})
            except ValidationError as exc:
                self._refuse(body, old, exc)
                return None
            seen = self.cache.observe(namespace, name) if old.attempts else NOTHING_SEEN
            generation = body["metadata"].get("generation")
            plan = reconcile(spec, old, generation, seen.jobs, datetime.now(UTC), lingering=seen.lingering)
            if plan.status != old:
                self.cluster.patch_status(namespace, name, plan.status.to_api())  # memory first, then act
            self._act(body, spec, plan)
            _count(old, plan)
            for event in plan.events:
                kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message)
            self.phases[body["metadata"]["uid"]] = plan.status.phase
            if progress and plan.status.phase == "Running" and not plan.create:
                self._progress(namespace, name, plan.status, seen)
            return plan.status

    def forget(self, uid: str) -> None:
        """A deleted job leaves the phase counts."""
        self.phases.pop(uid, None)

    def _refuse(self, body: dict[str, Any], old: MixedPrecisionJobStatus, exc: ValidationError) -> None:
        """A spec the models refuse: the job fails with the first problem (once)."""
        if old.phase == "Failed":
            return
        failed = old.model_copy(deep=True)
        failed.phase, failed.message = "Failed", f"invalid spec: {exc.errors()[0]['msg']}"
        generation = body["metadata"].get("generation")
        reason = ConditionReason.INVALID_SPEC
        st.set_condition(failed, ConditionType.FAILED, True, reason, failed.message, generation=generation)
        meta = body["metadata"]
        self.cluster.patch_status(meta["namespace"], meta["name"], failed.to_api())

    def _act(self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan) -> None:
        """Delete the attempts the plan ends, create the ones it starts (Service, then Job)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for index in plan.delete:
            self.cluster.delete_attempt(namespace, name, index)
        for start in plan.create:
            self.cluster.create_service(attempt_service(name, namespace, start.index, start.precision), owner=body)
            job = attempt_job(
                job=name,
                namespace=namespace,
                spec=spec,
                start=start,
                image=self.config.trainer_image,
                deadline_seconds=plan.deadline_seconds,
                trainer_command=self.config.trainer_command,
            )
            created = self.cluster.create_job(job, owner=body)
            if created is not None:
                # Into the cache at once: the Job's ADDED event then changes nothing, and the
                # next reconcile sees the Job even before its event arrives.
                self.cache.record_job(created)

    def _progress(self, namespace: str, name: str, status: MixedPrecisionJobStatus, seen: Observed) -> None:
        """Read the running attempt's rank-0 metrics and write what changed into the status."""
        ip = seen.rank0_ip.get(status.attempt or 0)
        if not ip:
            return
        patch = progress_patch(status, scrape_progress(ip, timeout=self.config.scrape_timeout_seconds))
        if patch:
            self.cluster.patch_status(namespace, name, patch)


def _count(old: MixedPrecisionJobStatus, plan: Plan) -> None:
    """The operator's attempt metrics for what the plan started, fell back from and ended."""
    for reason in plan.started_reasons:
        om.ATTEMPTS_STARTED.labels(reason=reason).inc()
    for src, dst in plan.fallbacks:
        om.FALLBACKS.labels(from_precision=src, to_precision=dst).inc()
    for before, after in zip(old.attempts, plan.status.attempts, strict=False):
        if before.reason is None and after.reason is not None:
            om.ATTEMPTS_ENDED.labels(reason=after.reason).inc()
