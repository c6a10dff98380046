"""One MixedPrecisionJob's reconcile: observe (the CR from the API server, its children from the
cache, and on a tick the running attempt's live progress: `progress.py`), decide
(`mpjob.planning.reconcile`, pure, on the status with that progress in it), act (status first,
then children, metrics, Events).

The work queue calls `Reconciler.handle` for a job key and never for one job in two threads at
once; the status is written before children are created, so it stays the operator's memory
across restarts. A child the API server refuses for good fails the job with the server's
message; any other failure is retried with per-job exponential backoff.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, cast

import kopf
from kubernetes.client.rest import ApiException
from pydantic import ValidationError

from mpjob.builders.attempt import attempt_job, attempt_name, attempt_service, labels
from mpjob.builders.network_policy import attempt_network_policy
from mpjob.builders.profile_token import attempt_profile_secret, attempt_token
from mpjob.controller import capacity, costs, leftovers, lostnodes
from mpjob.controller import metrics as om
from mpjob.controller.cache import NOTHING_SEEN, ChildCache, Observed
from mpjob.controller.cluster import Cluster, NameInUse, Refused
from mpjob.controller.config import OperatorConfig
from mpjob.controller.context import KopfContext
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.profiles import ProfileRequests
from mpjob.controller.progress import ProgressReader, changes_found, observed_in
from mpjob.controller.queue import QueueReader
from mpjob.controller.records import Key
from mpjob.controller.ticker import Standing, standing
from mpjob.controller.workqueue import Backoff, Retry
from mpjob.planning import cutoff
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.backoff import RetryBackoff
from mpjob.planning.inplace import in_place_plan
from mpjob.planning.observe import Observation
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt
from mpjob.planning.reconcile import FINISHED, reconcile
from mpjob.planning.status import ConditionReason, ConditionType, status_patch
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
        self.queue, self.nodes, self.profiles = (
            QueueReader(cluster),
            lostnodes.NodeReader(cluster),
            ProfileRequests(cluster, config.scrape_timeout_seconds, config.profile_key),
        )
        self.backoff = Backoff(base=config.retry_seconds, cap=config.retry_max_seconds)
        self.retries = RetryBackoff(base=config.attempt_backoff_seconds)
        self.context = KopfContext()
        #: The phase and troubles each job's last reconcile left, by UID (the ticker publishes the counts).
        self.phases: dict[str, Standing] = {}
        #: New jobs (no status yet) as kopf's watch delivered them, each used once by the job's
        #: first reconcile instead of a GET: a new job's first attempt Job is created one API
        #: round trip sooner. Only a status-less body is kept: nothing but this operator writes
        #: status, and the first reconcile writes it, so the GET could show nothing newer
        #: that matters (a spec edit in between comes as its own event and reconcile).
        self.unseen: dict[Key, dict[str, Any]] = {}
        #: Finished jobs whose children are all gone: the ticker leaves them alone (a change to
        #: one still queues its reconcile, which takes it out again if it has work).
        self.settled: set[Key] = set()

    def handle(self, key: Key, tick: bool) -> float | None:
        """A work queue item: reconcile one job (with its live progress when the ticker asked); the
        seconds after which its plan asks to be reconciled again (`Plan.requeue_after`). A failure is
        counted, logged and retried after the job's backoff; a tick does not hurry a retry not yet due."""
        namespace, name = key
        self.cache.wait_synced()  # as controllers wait for their informers: never plan from half a listing
        self.context.wait()  # kopf.event works only in a context kopf has set up
        if not self.peering.active(namespace):
            # A standby: kopf's own watch is paused too; the ticker comes back to the job. What it
            # read while it acted is forgotten: acting again, it reads anew (`unseen_for`).
            self.progress.forget(key)
            return None
        if tick and self.backoff.waiting(key):
            return None
        started = time.monotonic()
        try:
            plan = self.context.run(self.reconcile, namespace, name, progress=tick)
        except Exception as exc:
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
        """Observe, decide, act for one MixedPrecisionJob: its plan (None: the job is gone or its spec
        invalid). Safe to call from any trigger; with `progress`, live figures are read and written too."""
        with om.RECONCILE_SECONDS.time():
            body = self.unseen.pop((namespace, name), None) or self.cluster.read_job(namespace, name)
            if body is None:
                self.progress.forget((namespace, name))
                self.cache.forget_gone(namespace, name)
                return None
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
                fits = capacity.fits_now(self.cluster, spec, old, namespace=namespace, job=name)
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
            st.record_job_uids(plan.status, seen.uids)  # (of a Job made before they were recorded)
            self._write(body, body.get("status") or {}, plan.status)  # memory first, then act
            refusal = self._act(body, spec, plan, seen=seen)
            if refusal is not None:
                plan = self._refused(body, spec, plan, refusal=refusal)
            self._announce(body, observed, plan)
            costs.count(old, plan.status, spec.cost_per_gpu_hour)
            self.profiles.reconcile(body, spec, plan.status, seen)
            if plan.status.phase in FINISHED:
                self.progress.forget((namespace, name))
            self._settle((namespace, name), plan, seen)
            return plan

    def _settle(self, key: Key, plan: Plan, seen: Observed) -> None:
        """A finished job none of whose children is left (none seen, none deleted now) is settled."""
        if plan.status.phase in FINISHED and not (plan.delete or seen.jobs or seen.lingering):
            self.settled.add(key)
        else:
            self.settled.discard(key)

    def forget(self, uid: str, key: Key | None = None) -> None:
        """A deleted job leaves the phase counts (and the new jobs' bodies, and the cache the Jobs
        of it that were kept once removed: a finished job's may be all it has left)."""
        self.phases.pop(uid, None)
        if key is not None:
            self.unseen.pop(key, None)
            self.settled.discard(key)
            self.cache.forget_gone(*key)

    def first_sight(self, key: Key, body: dict[str, Any]) -> None:
        """A job kopf saw with no status yet: its first reconcile plans from this body."""
        if not body.get("status") and (body.get("metadata") or {}).get("uid"):
            self.unseen[key] = body

    def _write(self, body: dict[str, Any], stored: dict[str, Any], new: MixedPrecisionJobStatus) -> None:
        patch = status_patch(stored, new)
        if patch:
            self.cluster.patch_status(body["metadata"]["namespace"], body["metadata"]["name"], patch)

    def _refuse_spec(self, body: dict[str, Any], old: MixedPrecisionJobStatus, exc: ValidationError) -> None:
        """A spec the models refuse: the job fails with the first problem (once), cut as every
        message the status holds (a problem may name the field or echo the value it refuses),
        and a Warning Event `Failed` says it, as every other failure does."""
        if old.phase == "Failed":
            return
        failed = old.model_copy(deep=True)
        failed.phase, failed.message = "Failed", f"invalid spec: {spec_problems(exc)[0]}"[:1024]
        generation = body["metadata"].get("generation")
        reason = ConditionReason.INVALID_SPEC
        st.set_condition(failed, ConditionType.FAILED, True, reason, failed.message, generation=generation)
        self._write(body, body.get("status") or {}, failed)
        kopf.event(cast(kopf.Body, body), type="Warning", reason="Failed", message=failed.message)

    def _act(
        self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, *, seen: Observed
    ) -> tuple[int, Refused] | None:
        """Delete the attempts the plan ends (only Jobs of ours, by UID; the pods of those it cuts
        with a short grace period), create the ones it starts; the attempt whose children the API
        server refused for good, if any."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        cut = [pod for index in plan.cut if index in seen.jobs for pod in cutoff.to_cut(seen.jobs[index])]
        for pod in cut:  # before their Job: a kubelet keeps the grace a pod's first deletion gave
            self.cluster.cut_pod(namespace, pod.name, uid=pod.uid, grace=cutoff.CUT_GRACE_SECONDS)
        if cut:
            plan.events.append(cutoff.cut_event(cut))
            om.PODS_CUT.inc(len(cut))
        policies = self.config.network_policy is not None  # what a Job deleted leaving its children left
        if left := leftovers.stop(self.cluster, namespace, name, seen.orphans, policies=policies):
            self.cache.stopping(left)  # said once: a reconcile before the watch shows them going stops none again
            plan.events.append(cutoff.orphans_event(left))
        for index in plan.delete:
            if index in seen.uids:
                self.cluster.delete_job(namespace, name, index=index, uid=seen.uids[index])
        for start in plan.create:
            try:
                self._create(body, spec, plan, start=start)
            except Refused as refused:
                return start.index, refused
        return None

    def _create(self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, *, start: StartAttempt) -> None:
        """An attempt's profile-token Secret (owned by the job), its Job, then its Service and
        NetworkPolicy (owned by the Job, so they go with it)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        # The profile token's Secret first: the pods find it when they start.
        token = attempt_token(self.config.profile_key, uid=body["metadata"]["uid"], attempt=start.index)
        attempt, names = attempt_name(name, start.index), labels(name, start.index, start.precision)
        self.cluster.create_secret(attempt_profile_secret(attempt, namespace, names, token), owner=body)
        job = attempt_job(
            job=name, namespace=namespace, uid=body["metadata"]["uid"], spec=spec, start=start,
            image=self.config.trainer_image, deadline_seconds=plan.deadline_seconds,
            trainer_command=self.config.trainer_command, in_place=in_place_plan(spec, start, plan.status),
        )  # fmt: skip
        created, before = self.cluster.create_job(job, owner=body), plan.status.to_api()
        if st.record_job_uids(plan.status, {start.index: created["metadata"]["uid"]}):  # before its children
            self._write(body, before, plan.status)  # are made: a restart knows what it leaves as ours
        # Into the cache at once: the Job's ADDED event then changes nothing, and the next
        # reconcile sees the Job even before its event arrives.
        self.cache.record_job(created)
        service = attempt_service(name, namespace, start.index, start.precision)
        self.cluster.create_service(service, job=created, owner=body)
        if self.config.network_policy is not None:
            readers = self.config.network_policy
            policy = attempt_network_policy(
                name, namespace, index=start.index, precision=start.precision, readers=readers
            )
            self.cluster.create_network_policy(policy, job=created)

    def _refused(
        self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, *, refusal: tuple[int, Refused]
    ) -> Plan:
        """The API server refused attempt `index`'s children for good: the attempt and the job
        fail with its message, and what was made of the attempt goes."""
        (index, refused), meta = refusal, body["metadata"]
        om.REFUSALS.labels(reason=refused.rule.reason).inc()
        log.warning("%s/%s: the API server refused attempt %d: %s", meta["namespace"], meta["name"], index, refused)
        # The plan as it was, less the children it asked for (none of them is made now).
        failed = replace(
            plan, status=plan.status.model_copy(deep=True), events=list(plan.events), create=[], delete=[], cut=[]
        )
        when = When(st.now(), meta.get("generation"))
        lc.refused(failed, index=index, reason=refused.rule.reason, message=refused.message, when=when)
        self._write(body, plan.status.to_api(), failed.status)
        self._act(body, spec, failed, seen=self.cache.observe(meta["namespace"], meta["name"], meta["uid"]))
        return failed

    def _announce(self, body: dict[str, Any], observed: Observation, plan: Plan) -> None:
        """The plan's metrics and Events, the reading's (after the status that records them: a
        step it lists is never announced again, also by an operator that restarts right after;
        an Event lost then is the price of never posting one twice), and the phase and troubles
        the ticker counts."""
        om.count_plan(observed.status, plan)
        told = [(e.type, e.reason, e.message) for e in plan.events] + observed.told()
        for kind, reason, message in told:
            kopf.event(cast(kopf.Body, body), type=kind, reason=reason, message=message)
        self.phases[body["metadata"]["uid"]] = standing(plan.status)


#: The status fields this operator writes (camelCase): only these does a patch ever delete.
