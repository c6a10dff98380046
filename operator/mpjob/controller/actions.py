"""A reconcile's acts on the cluster, once its decision is written to the status: what the plan
ends goes (the pods it cuts first, with a short grace period, then the attempt Jobs, only ours by
UID, and what a Job deleted with --cascade=orphan left behind; a stray Job, made for an attempt
the status had ended, once: `strays.py`), what it starts is made (an attempt's profile-token
Secret, its Job, then its Service and NetworkPolicy; only the attempt the status written holds
current), and an attempt whose children the API server refuses for good fails with the server's
message (`Actions.refused`). First of all, each held Job's running pods are made owners of its
attempt's NetworkPolicy (`keepers.py`), so a Job deleted now leaves it to its pods.

A Job's Service and NetworkPolicy are owed until both are made (`Actions.owed`): a reconcile that
made the Job and then failed to make one (a 503, a timeout) leaves them owed, and the next
reconcile of the job makes them while that very Job is held and running. Without them its ranks
would find no rendezvous (the Service) or its metrics port would be open to every pod (the
NetworkPolicy). What is owed lives in memory: an operator that stops between a Job and its
children (a crash, a rollout) leaves them to the next, whose first reconcile of each job owes
them to every running Job of the job's that its status records (`attempts[].jobUid`) and makes
each once (one of ours already there answers 409 and is left as is). Nothing is read per tick to
find them; a standby forgets what it owed and rebuilds it when it acts again.

Every status write of a reconcile goes through `write_status`: the reconcile's own (its memory,
written before anything here acts) and the Job UIDs recorded before a new Job's children are made.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mpjob.builders.attempt import attempt_job, attempt_name, attempt_service, labels
from mpjob.builders.network_policy import attempt_network_policy
from mpjob.builders.profile_token import job_profile_secret, job_token
from mpjob.controller import leftovers
from mpjob.controller import metrics as om
from mpjob.controller.bodies import adopt
from mpjob.controller.cache import ChildCache, Observed
from mpjob.controller.cluster import Cluster, Refused, uid_of
from mpjob.controller.config import OperatorConfig
from mpjob.controller.keepers import PolicyKeepers
from mpjob.controller.records import Key
from mpjob.controller.strays import StrayJobs
from mpjob.planning import cutoff, history
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.inplace import in_place_plan
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt
from mpjob.planning.status import ConditionReason, ConditionType, status_patch
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

log = logging.getLogger("mpjob.operator")


def write_status(cluster: Cluster, body: dict[str, Any], stored: dict[str, Any], new: MixedPrecisionJobStatus) -> None:
    """Patch the job's status from `stored` to `new` (nothing when they agree), only if the job is
    still at `body`'s resourceVersion (a 409 Conflict otherwise: the reconcile is retried from a
    new read); `body` becomes the job as written (`bodies.adopt`: the version the write made, for
    the reconcile's next write and the next reconcile)."""
    write_patch(cluster, body, status_patch(stored, new))


def write_patch(cluster: Cluster, body: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge `patch` into the job's status at `body`'s resourceVersion (`write_status`)."""
    if patch:
        meta = body["metadata"]
        written = cluster.patch_status(
            meta["namespace"], meta["name"], patch, resource_version=meta.get("resourceVersion")
        )
        adopt(body, written)


@dataclass(frozen=True)
class Owed:
    """Attempt `index`'s Job (as the API server returned it when it was made, or its reference as
    a restart rebuilds it: `job_ref`), whose Service and NetworkPolicy may not be made yet."""

    index: int
    precision: str
    job: dict[str, Any]


class Actions:
    def __init__(self, config: OperatorConfig, cluster: Cluster, cache: ChildCache) -> None:
        self.config, self.cluster, self.cache = config, cluster, cache
        #: By job, by attempt: the Jobs made whose Service or NetworkPolicy may be missing.
        self.owed: dict[Key, dict[int, Owed]] = {}
        #: The jobs whose running Jobs were owed their children since this process began acting.
        self.rebuilt: set[Key] = set()
        self.strays = StrayJobs(cluster)
        self.keepers = PolicyKeepers(cluster)

    def apply(
        self,
        body: dict[str, Any],
        spec: MixedPrecisionJobSpec,
        plan: Plan,
        *,
        seen: Observed,
        strays: Mapping[int, str] | None = None,
    ) -> tuple[int, Refused] | None:
        """Delete the attempts the plan ends (only Jobs of ours, by UID; the pods of those it cuts
        with a short grace period) and the stray Jobs (`strays`, attempt -> UID: `history.strays`),
        create the ones it starts; the attempt whose children the API server refused for good, if any."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        if self.config.network_policy is not None:  # before a Job goes: its policy then stays with its pods
            self.keepers.keep((namespace, name), seen)
        grace = cutoff.CUT_GRACE_SECONDS  # before their Job: a kubelet keeps the grace a pod's first deletion gave
        due = [pod for index in plan.cut if index in seen.jobs for pod in cutoff.to_cut(seen.jobs[index])]
        cut = [pod for pod in due if self.cluster.cut_pod(namespace, pod.name, uid=pod.uid, grace=grace)]
        if cut:
            self.cache.stopping(cut, grace)  # said once: a reconcile before the watch shows them going cuts none again
            plan.events.append(cutoff.cut_event(cut))
            om.PODS_CUT.inc(len(cut))
        policies = self.config.network_policy is not None  # what a Job deleted leaving its children left
        if left := leftovers.stop(self.cluster, namespace, name, seen.orphans, policies=policies):
            self.cache.stopping(left)  # said once: a reconcile before the watch shows them going stops none again
            plan.events.append(cutoff.orphans_event(left))
        strays = strays or {}
        plan.events.extend(self.strays.delete((namespace, name), strays, held=seen.uids.values()))
        for index in plan.delete:
            if index not in seen.uids or index in strays:  # a stray goes once, above
                continue
            if self.cluster.delete_job(namespace, name, index=index, uid=seen.uids[index]):
                self.cache.removing(seen.uids[index])  # never deleted (and said) twice
        if (namespace, name) not in self.rebuilt:
            self._rebuild((namespace, name), plan, seen)
        if (refusal := self._pay((namespace, name), body, plan, seen)) is not None:
            return refusal
        for start in plan.create:
            if not history.current(plan.status, start.index):  # never one the status written has ended
                log.error("%s/%s: attempt %d is not the current one: its Job is not made", namespace, name, start.index)
                continue
            try:
                self._create(body, spec, plan, start=start)
            except Refused as refused:
                return start.index, refused
        return None

    def _create(self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, *, start: StartAttempt) -> None:
        """An attempt's profile-token Secret (owned by the job), its Job, then its Service and
        NetworkPolicy (owned by the Job, so they go with it)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        # The job's profile-token Secret first (made once, for every attempt): the pods find it when they start.
        token = job_token(self.config.profile_key, uid=body["metadata"]["uid"])
        self.cluster.create_secret(job_profile_secret(name, namespace, labels(name), token), owner=body)
        job = attempt_job(
            job=name, namespace=namespace, uid=body["metadata"]["uid"], spec=spec, start=start,
            image=self.config.trainer_image, deadline_seconds=plan.deadline_seconds,
            trainer_command=self.config.trainer_command, in_place=in_place_plan(spec, start, plan.status),
            lineage=history.lineage(plan.status, start.index),
            generation=body["metadata"].get("generation"),
        )  # fmt: skip
        created, before, said = self.cluster.create_job(job, owner=body), plan.status.to_api(), len(plan.started)
        # Into the cache at once: the Job's ADDED event then changes nothing, and the next
        # reconcile sees the Job even before its event arrives (also when the write below fails).
        self.cache.record_job(created)
        if lc.made(plan, spec, start.index, created["metadata"]["uid"]):  # before its children are made: a
            try:  # restart knows what it leaves as ours
                write_status(self.cluster, body, before, plan.status)
            except Exception:  # not known to hold (a 409: another operator's won; a 500, a timeout):
                del plan.started[said:]  # the write that records the uid tells the start
                raise
        owed = Owed(start.index, start.precision, created)
        self.owed.setdefault((namespace, name), {})[start.index] = owed
        self._children(body, owed)

    def _rebuild(self, key: Key, plan: Plan, seen: Observed) -> None:
        """The job's first reconcile since this process began acting: each of its running Jobs
        the status records as its own is owed its children (its maker may have stopped before
        them); `_pay` makes them, once."""
        recorded, entries = st.job_uids(plan.status), {a.index: a for a in plan.status.attempts}
        for index, uid in seen.uids.items():
            view, entry = seen.jobs.get(index), entries.get(index)
            if recorded.get(index) != uid or view is None or view.finished or entry is None:
                continue
            owed = Owed(index, entry.precision, job_ref(key, index, uid))
            self.owed.setdefault(key, {}).setdefault(index, owed)
        self.rebuilt.add(key)

    def _pay(self, key: Key, body: dict[str, Any], plan: Plan, seen: Observed) -> tuple[int, Refused] | None:
        """Make the children owed to the job's Jobs that are still the ones made, held and
        running, not deleted now; the attempt whose child the API server refused for good, if
        any. What is owed to a Job gone, finished, made again or deleted now is forgotten."""
        for index, owed in sorted(self.owed.get(key, {}).items()):
            view = seen.jobs.get(index)
            held = seen.uids.get(index) == uid_of(owed.job) and view is not None and not view.finished
            if not held or index in plan.delete:
                self._paid(key, index)
                continue
            try:
                self._children(body, owed)
            except Refused as refused:
                return index, refused
        return None

    def _children(self, body: dict[str, Any], owed: Owed) -> None:
        """Make the Service (always) and NetworkPolicy (when the operator is configured with one)
        of the Job `owed`; one of ours that exists already is left as is. Paid once both are."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        service = attempt_service(name, namespace, owed.index, owed.precision)
        self.cluster.create_service(service, job=owed.job, owner=body)
        if (readers := self.config.network_policy) is not None:
            policy = attempt_network_policy(
                name, namespace, index=owed.index, precision=owed.precision, readers=readers
            )
            self.cluster.create_network_policy(policy, job=owed.job)
        self._paid((namespace, name), owed.index)

    def _paid(self, key: Key, index: int) -> None:
        owed = self.owed.get(key, {})
        owed.pop(index, None)
        if not owed:
            self.owed.pop(key, None)

    def refuse_spec(self, body: dict[str, Any], old: MixedPrecisionJobStatus, message: str) -> MixedPrecisionJobStatus:
        """The job whose spec the models refuse fails with `message`, cut as every message the
        status holds (a problem may name the field or echo the value it refuses); the status
        written. An attempt still running (the spec edited while it ran) ends with it; its Job
        goes once that is written (`stop_refused`): nothing runs for a job that failed."""
        failed, meta = old.model_copy(deep=True), body["metadata"]
        failed.phase, failed.message = "Failed", message[:1024]
        reason, newest = ConditionReason.INVALID_SPEC, old.attempts[-1].index if old.attempts else None
        running = newest if newest is not None and history.current(old, newest) else None
        if running is not None:
            st.end_attempt(failed, running, reason, None, failed.message, failed.step, st.now())
        st.set_condition(failed, ConditionType.FAILED, True, reason, failed.message, generation=meta.get("generation"))
        write_status(self.cluster, body, body.get("status") or {}, failed)
        return failed

    def stop_refused(self, body: dict[str, Any], status: MixedPrecisionJobStatus) -> None:
        """Delete the Job of the attempt a refused spec ended (`refuse_spec`) while the cache shows
        it, ours by UID (its trainers checkpoint on SIGTERM). Every reconcile of the failed job
        asks (no plan is made for it: its spec is refused), so a delete that failed, or a restart
        between the status write and the delete, still stops it; once deleted the cache shows it
        removed, and it is not asked again."""
        last = status.attempts[-1] if status.attempts else None
        if last is None or last.reason != ConditionReason.INVALID_SPEC:
            return
        meta, index = body["metadata"], history.job_index(status, last.index)
        seen = self.cache.observe(meta["namespace"], meta["name"], meta["uid"])
        uid = seen.uids.get(index)
        if index not in seen.jobs or uid is None:
            return
        if self.cluster.delete_job(meta["namespace"], meta["name"], index=index, uid=uid):
            self.cache.removing(uid)

    def forget(self, key: Key) -> None:
        """The job `key` is gone, or another operator acts on it now: nothing is owed to its Jobs
        (what is, a reconcile of it rebuilds)."""
        self.owed.pop(key, None)
        self.rebuilt.discard(key)
        self.strays.forget(key)
        self.keepers.forget(key)

    def refused(
        self, body: dict[str, Any], spec: MixedPrecisionJobSpec, plan: Plan, *, refusal: tuple[int, Refused]
    ) -> Plan:
        """The API server refused attempt `index`'s children for good: the attempt and the job
        fail with its message, and what was made of the attempt goes."""
        (index, refused), meta = refusal, body["metadata"]
        om.REFUSALS.labels(reason=refused.rule.reason).inc()
        log.warning("%s/%s: the API server refused attempt %d: %s", meta["namespace"], meta["name"], index, refused)
        # The plan's status, less the children it asked for (none of them is made now); what the
        # plan itself told and counted was told and counted once its status was written.
        failed = replace(
            plan, status=plan.status.model_copy(deep=True), events=[], started=[], fallbacks=[], repromotions=[],
            create=[], delete=[], cut=[],
        )  # fmt: skip
        when = When(st.now(), meta.get("generation"))
        lc.refused(failed, index=index, reason=refused.rule.reason, message=refused.message, when=when)
        write_status(self.cluster, body, plan.status.to_api(), failed.status)
        self.apply(body, spec, failed, seen=self.cache.observe(meta["namespace"], meta["name"], meta["uid"]))
        return failed


def job_ref(key: Key, index: int, uid: str) -> dict[str, Any]:
    """Attempt `index`'s Job of the job `key`, as much of it as its children's controller
    reference and the check of whose child exists read: kind, name, namespace, UID."""
    namespace, name = key
    meta = {"name": attempt_name(name, index), "namespace": namespace, "uid": uid}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta}
