"""One MixedPrecisionJob's reconcile: observe (the CR as the operator was last shown it, by
kopf's watch or its own status write, or from the API server when it holds none or the job's
last reconcile failed: `bodies.py`; its children from the cache; and on a tick the running
attempt's live progress: `progress.py`), decide
(`mpjob.planning.reconcile`, pure, on the status with that progress in it), act (status first,
then metrics and Events, then children: `actions.py`; an attempt whose first Job acting made
is said and counted started after it).

The work queue calls `Reconciler.handle` for a job key and never for one job in two threads at
once; the status is written before children are created, so it stays the operator's memory
across restarts, and only at the resourceVersion of the body the reconcile planned from, so that
a second operator acting on the same job (or one that stalled, or a body behind the job) never
overwrites it from an older read: the write is refused (409) and the retry reads the job anew. A child
the API server refuses for good fails the job with the server's message; any other failure is
retried with per-job exponential backoff.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from mpjob.controller import capacity, costs, lostnodes
from mpjob.controller import metrics as om
from mpjob.controller.actions import Actions, write_status
from mpjob.controller.bodies import Bodies
from mpjob.controller.cache import NOTHING_SEEN, ChildCache, Observed
from mpjob.controller.cluster import Cluster, NameInUse
from mpjob.controller.config import OperatorConfig
from mpjob.controller.context import KopfContext
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.profiles import ProfileRequests
from mpjob.controller.progress import ProgressReader, changes_found, observed_in
from mpjob.controller.queue import QueueReader
from mpjob.controller.quotas import QuotaReader
from mpjob.controller.records import Key
from mpjob.controller.ticker import Standing, at_rest, standing
from mpjob.controller.workqueue import Backoff, Retry
from mpjob.planning import history
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.backoff import RetryBackoff
from mpjob.planning.plan import Event, Plan
from mpjob.planning.reconcile import FINISHED, reconcile
from mpjob.validation import spec_problems
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

log = logging.getLogger("mpjob.operator")


class Reconciler:
    def __init__(
        self,
        *,
        config: OperatorConfig,
        cluster: Cluster,
        cache: ChildCache,
        peering: PeeringCheck,
        progress: ProgressReader | None = None,
    ) -> None:
        self.config, self.cluster, self.cache, self.peering = config, cluster, cache, peering
        self.progress = progress or ProgressReader(
            concurrency=config.progress_readers,
            deadline=config.scrape_timeout_seconds,
            max_bytes=config.scrape_max_bytes,
        )
        self.queue, self.nodes, self.room, self.quotas, self.profiles = (
            QueueReader(cluster),
            lostnodes.NodeReader(cluster),
            capacity.RoomReader(cluster, fresh_seconds=config.tick_seconds),  # one read a tick for every job
            QuotaReader(cluster),
            ProfileRequests(cluster, config.scrape_timeout_seconds, config.profile_key),
        )
        self.actions = Actions(config, cluster, cache)
        self.backoff = Backoff(base=config.retry_seconds, cap=config.retry_max_seconds)
        self.retries = RetryBackoff(base=config.attempt_backoff_seconds)
        self.context = KopfContext()
        #: The phase and troubles each unfinished job's last reconcile left, by UID (the ticker
        #: publishes the counts; finished jobs it counts from kopf's index, `handlers.finished_jobs`).
        self.phases: dict[str, Standing] = {}
        #: The newest body of each job, from kopf's watch and this operator's own status writes:
        #: a reconcile plans from it, and GETs the job only when none is held or its last
        #: reconcile failed (`bodies.py`); a quiet tick asks the API server nothing.
        self.bodies = Bodies()
        #: Jobs at rest the ticker's index still says have work (suspended, or finished with a TTL;
        #: their children all gone), with the resourceVersion each settled at: the ticker leaves them
        #: alone, and so does kopf's listing of one unchanged since (`at_rest_unchanged`); a change
        #: to one still queues its reconcile, which takes it out again if it has work.
        self.settled: dict[Key, str | None] = {}

    def handle(self, key: Key, tick: bool) -> float | None:
        """A work queue item: reconcile one job (with its live progress when the ticker asked); the
        seconds after which its plan asks to be reconciled again (`Plan.requeue_after`). A failure is
        counted, logged and retried after the job's backoff; a tick does not hurry a retry not yet due,
        and does nothing to a job at rest (one a reconcile settled after the ticker queued it)."""
        namespace, name = key
        self.cache.wait_synced()  # as controllers wait for their informers: never plan from half a listing
        self.context.wait()  # kopf.event works only in a context kopf has set up
        if not self.peering.active(namespace):
            # A standby: kopf's own watch is paused too; the ticker comes back to the job. What it
            # read while it acted is forgotten: acting again, it reads anew (the job, `unseen_for`), and
            # rebuilds what the job's Jobs are owed (`actions`: the other may have made one).
            self._let_go(key)
            return None
        if tick and (self.backoff.waiting(key) or key in self.settled):
            return None  # a tick does not hurry a retry, nor wake a job that settled while it waited
        started = time.monotonic()
        try:
            plan = self.context.run(self.reconcile, namespace, name, progress=tick)
        except Exception as exc:  # a 409 among others: the retry reads the job anew
            self.bodies.refused(key)
            raise self._retry(key, exc, time.monotonic() - started) from exc
        self.backoff.forget(key)
        return plan.requeue_after if plan is not None else None

    def _retry(self, key: Key, exc: Exception, seconds: float) -> Retry:
        kind = f"api{exc.status}" if isinstance(exc, ApiException) else type(exc).__name__
        om.ERRORS.labels(kind=kind).inc()
        om.RETRIES.labels(kind=kind).inc()
        delay = self.backoff.failed(key)
        failures = self.backoff.failures(key)
        what = f"reconcile of {key[0]}/{key[1]} failed after {seconds:.2f}s (failure {failures} in a row)"
        if isinstance(exc, ApiException | NameInUse | OSError) or "urllib3" in type(exc).__module__:
            log.warning("%s: %s; retrying in %.1fs", what, getattr(exc, "reason", None) or exc, delay)
        else:
            log.exception("%s; retrying in %.1fs", what, delay)
        return Retry(delay)

    def reconcile(self, namespace: str, name: str, *, progress: bool = False) -> Plan | None:
        """Observe, decide, act for one MixedPrecisionJob: its plan (None: the job is gone, being
        deleted, or its spec invalid). Safe to call from any trigger; with `progress`, live figures
        are read and written too."""
        with om.RECONCILE_SECONDS.time():
            body = self.bodies.body((namespace, name), lambda: self.cluster.read_job(namespace, name))
            if body is None:
                self.cache.forget_gone(namespace, name)
                self._let_go((namespace, name))
                return None
            if body["metadata"].get("deletionTimestamp") is not None:
                # Being deleted (its generation bumped, not its spec): nothing more is started or
                # remade for it; its children go with it (garbage collection), its volumes stay.
                return None
            try:
                return self._reconcile(body, progress=progress)
            finally:  # what its writes answered: the next reconcile's body
                self.bodies.offer((namespace, name), body, only_held=True)

    def _reconcile(self, body: dict[str, Any], *, progress: bool) -> Plan | None:
        """`reconcile` of the job as `body` holds it (each status write makes it the job as written)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        old = MixedPrecisionJobStatus.model_validate(body.get("status") or {})
        try:
            spec = MixedPrecisionJobSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            self._refuse_spec(body, old, exc)
            return None
        uid, ours = body["metadata"]["uid"], st.job_uids(old)  # ours: also a Job deleted while it restarted
        seen = self.cache.observe(namespace, name, uid, recorded=ours) if old.attempts else NOTHING_SEEN
        if lostnodes.suspect(seen) and (nodes := self.nodes.seen()) is not None:
            seen = self.cache.observe(namespace, name, uid, nodes, recorded=ours)  # a pod on a lost node ended
        now = datetime.now(UTC)
        jobs = self.queue.with_words(namespace, spec, old, seen)
        if spec.run_policy.queue_name:  # the queue's quota sizes it, not the nodes
            fits = self.queue.room(namespace, spec, old, jobs)
        else:
            fits = capacity.fits_now(self.room, spec, old, namespace=namespace, job=name)
            fits = self.quotas.within(fits, spec, old, namespace=namespace)
        generation = body["metadata"].get("generation")
        read = self.progress.poll((namespace, name), old, seen.rank0_ip) if progress else None
        made = changes_found(read[1]) if read else []  # fallbacks in place: the plan records them
        observed = observed_in(
            old, read, made, now, spec.checkpoint.every_steps
        )  # the plan decides on the newest figures
        unseen_for = self.progress.unseen_for((namespace, name), old.attempt)  # after the poll's take
        plan = reconcile(
            spec, observed.status, generation, jobs, now, lingering=seen.lingering, fits=fits, changes=made,
            unseen_for=unseen_for, stopped=seen.stopped, retries=self.retries,
        )  # fmt: skip
        held = seen.held()  # by attempt: each Job's UID and creationTimestamp
        strays = history.strays(old, held)  # made for an attempt ended already: deleted, never recorded
        for index, uid in history.own(old, held).items():  # a Job made before its uid was recorded: said
            lc.made(plan, spec, index, uid)  # started if this write holds (the one that records it tells it)
        write_status(self.cluster, body, body.get("status") or {}, plan.status)  # memory first, then act
        costs.count(old, plan.status, spec.cost_per_gpu_hour)  # its write held: counted, whatever acting does
        self._announce(body, observed.status, plan, observed.told())  # its write held: told by this operator only
        plan = self._act(body, spec, plan, seen, strays)
        if not self.profiles.reconcile(body, spec, plan.status, seen):
            self.bodies.refused((namespace, name))  # its write's 409: the body is behind the job, read it anew
        if plan.status.phase in FINISHED:
            self.progress.forget((namespace, name))
        self._settle((namespace, name), plan, seen, spec, body["metadata"].get("resourceVersion"))
        return plan

    def _act(
        self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, seen: Observed, strays: dict[int, str]
    ) -> Plan:
        """Carry out `plan` (its status written, its Events told, its costs counted), telling what
        acting did (pods cut, pods left behind stopped) and saying and counting started each attempt
        whose first Job it made, also when making what comes after that Job fails (its retry finds the
        Job made and says nothing); the plan that stands after it (a failed one if a child is refused)."""
        planned, said, refusal = len(plan.events), len(plan.started), None
        try:
            refusal = self.actions.apply(body, spec, plan, seen=seen, strays=strays)
        finally:
            self._tell(body, plan.events[planned:])
            # an attempt whose children are refused never started
            begun = [s for s in plan.started[said:] if refusal is None or s.index != refusal[0]]
            om.count_started(begun)
            self._tell(body, [event for started in begun for event in started.events])
        if refusal is not None:
            told, plan = plan.status, self.actions.refused(body, spec, plan, refusal=refusal)
            costs.count(told, plan.status, spec.cost_per_gpu_hour)
            self._announce(body, told, plan, [])
        return plan

    def _settle(self, key: Key, plan: Plan, seen: Observed, spec: MixedPrecisionJobSpec, version: str | None) -> None:
        """A job at rest (`ticker.at_rest`: finished or suspended, none of its children left,
        none deleted now) is settled at `version` (its resourceVersion after this reconcile's
        writes): the ticker no longer reads it every tick. Of a finished one nothing is held
        (`_release`): nothing more is owed for it."""
        children = bool(plan.delete or seen.jobs or seen.lingering or seen.orphans)
        suspend, again = bool(spec.run_policy.suspend), plan.requeue_after
        if not at_rest(plan.status.phase, suspend=suspend, children=children, requeue_after=again):
            self.settled.pop(key, None)
        elif plan.status.phase in FINISHED:
            self._release(key, version, ttl=spec.run_policy.ttl_seconds_after_finished is not None)
        else:
            self.settled[key] = version

    def at_rest_unchanged(self, key: Key, version: str | None) -> bool:
        """Whether the job `key` settled at `version` and is listed at it again (kopf lists every
        job each time its watch reconnects): nothing about it changed, nothing is to be done."""
        return version is not None and key in self.settled and self.settled[key] == version

    def _release(self, key: Key, version: str | None, *, ttl: bool) -> None:
        """A finished job at rest: its body and what acting on it held go (a reconcile of it,
        after a spec edit, reads and rebuilds them); it stays settled only where the ticker's
        index still says it has work (`ticker.has_work`: a TTL), which a finished job without one
        never has."""
        self.bodies.release(key)
        self.actions.forget(key)
        if ttl:
            self.settled[key] = version
        else:
            self.settled.pop(key, None)

    def forget(self, uid: str, key: Key | None = None) -> None:
        """A deleted job leaves the phase counts (and what this process holds of it: `_let_go`,
        and the cache the Jobs of it that were kept once removed: a finished job's may be all it
        has left)."""
        self.phases.pop(uid, None)
        if key is not None:
            self.cache.forget_gone(*key)
            self._let_go(key)

    def _let_go(self, key: Key) -> None:
        """The job `key` is gone, or a standby no longer acts on it: its body, its rank 0's
        reading, what its Jobs were owed, and that it was at rest are forgotten (acting on it again
        reads them anew: the other may have resumed it, and the ticker comes back to it)."""
        self.settled.pop(key, None)
        self.progress.forget(key)
        self.actions.forget(key)
        self.bodies.forget(key)

    def _refuse_spec(self, body: dict[str, Any], old: MixedPrecisionJobStatus, exc: ValidationError) -> None:
        """A spec the models refuse: the job fails with the first problem (once: `Actions.refuse_spec`),
        a Warning Event `Failed` says it, as every other failure does, and the Job of an attempt
        it ended goes (`Actions.stop_refused`: asked again at each reconcile until it has)."""
        if old.phase != "Failed":
            old = self.actions.refuse_spec(body, old, f"invalid spec: {spec_problems(exc)[0]}")
            kopf.event(cast(kopf.Body, body), type="Warning", reason="Failed", message=old.message or "")
        self.actions.stop_refused(body, old)

    def _announce(self, body: dict[str, Any], old: MixedPrecisionJobStatus, plan: Plan, read: list[Event]) -> None:
        """The plan's metrics and Events, and those of the reading (`read`), once the status that
        records them is written, before the plan's children are made: a step it lists is never
        announced again, also by an operator that restarts right after or a second one whose
        write from an older read is refused, and a failure while making the children (a write
        of another operator in between) does not lose them; an Event lost to a crash right
        after the write is the price of never posting one twice. Then the phase and troubles
        the ticker counts."""
        om.count_plan(old, plan)
        self._tell(body, plan.told + read)
        if plan.status.phase in FINISHED:  # counted from kopf's index (`handlers.finished_jobs`)
            self.phases.pop(body["metadata"]["uid"], None)
        else:
            self.phases[body["metadata"]["uid"]] = standing(plan.status)

    @staticmethod
    def _tell(body: dict[str, Any], events: list[Event]) -> None:
        """Post `events` about the job (kopf's queue sends them)."""
        for event in events:
            kopf.event(cast(kopf.Body, body), type=event.type, reason=event.reason, message=event.message)
