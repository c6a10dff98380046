"""The child cache's store (`cache.py` holds its lock around every call): attempt Jobs, their
pods and the Job controller's FailedCreate Events, indexed by the MixedPrecisionJob and the Job
they belong to, and how long each is kept.

A Job the API server removed stays while any of its pods does (its attempt is lingering while
one still runs), and after that with its pods as last seen until the operator has gone past it:
a Job of a later attempt of its MixedPrecisionJob is held (or of the same one, created again), or
the operator found the MixedPrecisionJob gone (`forget_gone`). A Job deleted while its pods ran
(a suspension, a resize, a hand deletion) tells what they did only once they have stopped (the
trainer's report of the checkpoint it wrote on SIGTERM, the seconds they ran), and their removal
follows that stop at once, usually before the reconcile it queued has run.
A pod the API server removed stays as it was last seen, stopped, while its Job is held
(`deleted`): how an attempt ended is written on its pods (the cluster's DisruptionTarget, the
exit code, the trainer's report) while the Job's verdict says only that a pod failed, and an
evicted pod can be gone before the reconcile that ends its attempt runs. It goes when its index
runs again in a new pod (its queue admitted the Job again), or with its Job.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from mpjob.controller.create_failures import CreateFailure
from mpjob.controller.ownership import ObjectRef
from mpjob.controller.records import JobRecord, Key, PodRecord, attempt_named

Record = JobRecord | PodRecord | CreateFailure


@dataclass(frozen=True)
class Held:
    """What is held of one MixedPrecisionJob's attempt Jobs (a Job removed but lingering too)."""

    jobs: list[JobRecord]
    pods: dict[str, list[PodRecord]]  # by Job UID
    failures: dict[str, CreateFailure | None]  # by Job UID: its latest FailedCreate
    #: By attempt: pods of an attempt Job of its name that is not held (`strays`).
    strays: dict[int, list[PodRecord]]


class Children:
    def __init__(self) -> None:
        self._jobs: dict[str, JobRecord] = {}  # by Job UID; a deleted one stays while pods remain
        self._keys: dict[Key, set[str]] = {}  # MixedPrecisionJob -> its Jobs' UIDs
        self._pods: dict[str, PodRecord] = {}  # by pod UID
        self._by_job: dict[ObjectRef, set[str]] = {}  # the Job pods name -> their UIDs
        #: (namespace, the MixedPrecisionJob a Job's name names) -> the Jobs pods name (`_strays`)
        self._named: dict[tuple[str, str], set[ObjectRef]] = {}
        self._failures: dict[ObjectRef, CreateFailure] = {}  # the Job it names -> its latest FailedCreate
        self._failed: dict[str, ObjectRef] = {}  # a held FailedCreate's Event UID -> the Job it names
        self._gone: set[str] = set()  # pods the API server removed, held as last seen
        self._asked: dict[str, int | None] = {}  # pods the operator asked to delete -> the grace (`deleting`)
        #: Jobs the operator deleted, until the watch (or a listing) shows them gone: UID -> their job.
        self._removing: dict[str, Key] = {}

    def of(self, owner: ObjectRef) -> Held:
        """The attempt Jobs the MixedPrecisionJob `owner` controls, with their pods and failures."""
        jobs = [self._jobs[uid] for uid in self._keys.get((owner.namespace, owner.name), ())]
        jobs = [job for job in jobs if job.owner == owner]
        pods = {job.uid: [self._pods[uid] for uid in self._by_job.get(job.ref, ())] for job in jobs}
        return Held(jobs, pods, {job.uid: self._failures.get(job.ref) for job in jobs}, self._strays(owner))

    def _strays(self, owner: ObjectRef) -> dict[int, list[PodRecord]]:
        """Pods whose Job, named as an attempt of `owner` in its namespace, is not held: it was
        removed before this operator listed it (it restarted while they stopped, or while they ran
        on, left behind by a deletion with --cascade=orphan). Found by that name (`_named`), not
        by a scan of every Job's pods. Unless `owner`'s status recorded their Job's UID (`adopt`),
        whose they are cannot be checked: they only ever make the next attempt wait
        (`cache.Observed.lingering`), as pods of that name may still write checkpoints."""
        strays: dict[int, list[PodRecord]] = {}
        for ref in self._named.get((owner.namespace, owner.name), ()):
            if self._job(ref) is not None:
                continue
            if (attempt := attempt_named(ref.name, owner.name)) is not None:
                strays.setdefault(attempt, []).extend(self._pods[uid] for uid in self._by_job.get(ref, ()))
        return strays

    def adopt(self, owner: ObjectRef, recorded: Mapping[int, str]) -> None:
        """Hold, as removed, each Job of `owner`'s that is not held but that its status records
        (`recorded`: attempt -> the UID of the Job made for it) and whose pods are still there (it
        was deleted while this operator was away: as usual, its pods still stopping, or with
        --cascade=orphan, its pods left with no controller): of that very namespace, name and UID,
        this operator made it, and its pods are followed, read and charged once they stop (and
        stopped, if orphaned: `cache.orphans_of`) as if it had held it throughout. Pods whose
        Job's UID is not recorded stay strays."""
        for ref in list(self._named.get((owner.namespace, owner.name), ())):
            attempt = attempt_named(ref.name, owner.name)
            if attempt is None or recorded.get(attempt) != ref.uid or ref.uid in self._jobs:
                continue
            job = JobRecord(ref, owner, attempt, finished=None, reason=None, suspended=False, gone=True)
            self._jobs[ref.uid] = job
            self._keys.setdefault(job.key, set()).add(ref.uid)

    def deleting(self, uids: Iterable[str], grace: int | None = None) -> None:
        """The operator asked for the deletion of the pods `uids` (with `grace` seconds; None:
        their own): each is held as going from now on, with the shortest grace asked, also before
        (or against a stale event from before) the watch shows it."""
        for uid in uids:
            if (pod := self._pods.get(uid)) is not None:
                self._pods[uid] = _asked(pod, grace)
                self._asked[uid] = self._pods[uid].view.grace  # the shortest asked (or shown)

    def removing(self, uid: str) -> None:
        """The operator deleted the Job `uid`: held as removed from now on, as the watch will show
        it (its pods still stopping make its attempt lingering), also against a stale event from
        before: a reconcile before the watch's DELETED never acts on it again (deletes it and says
        so twice, as an edited Pending attempt's Job made again was)."""
        if (job := self._jobs.get(uid)) is not None:
            self._removing[uid] = job.key
            self._drop_job(uid)

    def has_job(self, uid: str) -> bool:
        return uid in self._jobs

    def held(self, resource: str) -> dict[str, Record]:
        """What is held of `resource` (jobs, pods, events), by object UID (a copy)."""
        if resource == "events":
            return {f.uid: f for f in self._failures.values()}
        return dict(self._jobs if resource == "jobs" else self._pods)

    def relist(self, resource: str, namespace: str | None, fresh: Mapping[str, Record]) -> set[Key]:
        """Swap in a full listing of `resource` in `namespace` (None: all), by UID; the jobs whose
        reconcile is due. A Job deleted (`removing`) that it lacks is gone for good."""
        due: set[Key | None] = set()
        for uid in [u for u, r in self.held(resource).items() if namespace is None or _namespace(r) == namespace]:
            if uid not in fresh:
                due.add(self.drop(resource, uid))
        due.update(self.put(record) for record in fresh.values())
        if resource == "jobs":
            for uid, where in list(self._removing.items()):
                if (namespace is None or where[0] == namespace) and uid not in fresh:
                    del self._removing[uid]
        return {key for key in due if key is not None}

    def put(self, record: Record) -> Key | None:
        """Keep `record`; the job whose reconcile is due, if any."""
        if isinstance(record, JobRecord):
            if record.uid in self._removing:  # an event from before its deletion, read after it
                return None
            old = self._jobs.get(record.uid)
            if old is None or old.gone:  # (a Job removed, seen again: a stale listing, kept as new)
                self._forget_gone(record.key, up_to=record.attempt)  # the operator went on past them
            self._jobs[record.uid] = record
            self._keys.setdefault(record.key, set()).add(record.uid)
            return record.key if record.news(old) else None
        if isinstance(record, PodRecord):
            return self._put_pod(record)
        old_failure = self._failures.get(record.owner)
        if old_failure is not None:
            self._failed.pop(old_failure.uid, None)
        self._failures[record.owner], self._failed[record.uid] = record, record.owner
        news = old_failure is None or old_failure.message != record.message
        return self._key_of(record.owner) if news else None

    def drop(self, resource: str, uid: str, *, last: Record | None = None) -> Key | None:
        """The API server removed the object `uid` of `resource` (`last`: how a pod was when it
        went, if read); the job whose reconcile is due, if any."""
        if resource == "jobs":
            if (key := self._removing.pop(uid, None)) is not None:
                return key  # held as removed already (`removing`): its job looks again all the same
            return self._drop_job(uid)
        if resource == "pods":
            return self._drop_pod(uid, last if isinstance(last, PodRecord) else None)
        if (job := self._failed.get(uid)) is not None:
            self._drop_failure(job)
        return None

    def _drop_failure(self, job: ObjectRef) -> None:
        """Forget the FailedCreate held for `job` (by its Event UID too)."""
        if (failure := self._failures.pop(job, None)) is not None:
            self._failed.pop(failure.uid, None)

    def _put_pod(self, record: PodRecord) -> Key | None:
        old = self._pods.get(record.uid)
        if record.uid in self._asked:
            record = _asked(record, self._asked[record.uid])
        self._pods[record.uid] = record
        if old is not None and old.owner != record.owner:  # an owner reference moved
            self._unlink(old.owner, record.uid)
        self._by_job.setdefault(record.owner, set()).add(record.uid)
        self._named.setdefault(_named(record.owner), set()).add(record.owner)
        for replaced in self._gone_pods(record.owner, index=record.view.index):  # its index runs again
            if replaced != record.uid:
                self._remove_pod(replaced)
        return self._key_of(record.owner) if record.news(old) else None

    def _drop_pod(self, uid: str, last: PodRecord | None) -> Key | None:
        """Keep the removed pod as last seen while its Job is held, gone or not (else forget it)."""
        pod = self._pods.get(uid)
        if pod is None:
            return None
        job = self._job(pod.owner)
        if job is None:
            self._remove_pod(uid)
            return None
        if uid in self._gone:
            return None  # kept already (a relisting lacks it, as it should)
        seen = last if last is not None and last.owner == pod.owner else pod  # `last`: the same UID
        self._pods[uid] = deleted(seen)
        self._gone.add(uid)
        self._forget_gone(job.key, up_to=self._newest(job.key))
        return job.key

    def _remove_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid)
        self._gone.discard(uid)
        self._asked.pop(uid, None)
        self._unlink(pod.owner, uid)

    def _unlink(self, job: ObjectRef, uid: str) -> None:
        """The pod `uid` is no longer one of `job`'s (a Job none of whose pods is held leaves both indexes)."""
        siblings = self._by_job.get(job, set())
        siblings.discard(uid)
        if siblings:
            return
        self._by_job.pop(job, None)
        named = self._named.get(_named(job), set())
        named.discard(job)
        if not named:
            self._named.pop(_named(job), None)

    def _gone_pods(self, job: ObjectRef, *, index: int | None = None) -> list[str]:
        """The UIDs of `job`'s pods kept after the API server removed them (of one index)."""
        gone = (self._pods[uid] for uid in self._by_job.get(job, ()) if uid in self._gone)
        return [pod.uid for pod in gone if index is None or pod.view.index == index]

    def _drop_job(self, uid: str) -> Key | None:
        job = self._jobs.get(uid)
        if job is None:
            return None
        if self._by_job.get(job.ref):  # its pods still stop, or tell how they stopped: whose they are
            self._jobs[uid] = replace(job, gone=True)
            self._forget_gone(job.key, up_to=self._newest(job.key))
        else:
            self._forget_job(job)
        return job.key

    def forget_gone(self, key: Key) -> None:
        """Forget the removed Jobs of the MixedPrecisionJob `key` whose pods have all stopped, with
        those pods (the operator found the MixedPrecisionJob gone)."""
        self._forget_gone(key, up_to=None)

    def _forget_gone(self, key: Key, *, up_to: int | None) -> None:
        """Forget `key`'s removed Jobs none of whose pods runs, of attempts up to `up_to` (None: all)."""
        for uid in list(self._keys.get(key, ())):
            job = self._jobs[uid]
            pods = [self._pods[p] for p in self._by_job.get(job.ref, ())]
            if job.gone and (up_to is None or job.attempt <= up_to) and not any(p.view.alive for p in pods):
                for pod in pods:
                    self._remove_pod(pod.uid)
                self._forget_job(job)

    def _newest(self, key: Key) -> int:
        """The newest attempt of `key` whose Job is held and not gone (-1: none)."""
        return max((j.attempt for j in (self._jobs[u] for u in self._keys.get(key, ())) if not j.gone), default=-1)

    def _forget_job(self, job: JobRecord) -> None:
        self._jobs.pop(job.uid, None)
        self._drop_failure(job.ref)
        uids = self._keys.get(job.key, set())
        uids.discard(job.uid)
        if not uids:
            self._keys.pop(job.key, None)

    def _job(self, ref: ObjectRef) -> JobRecord | None:
        """The Job a child names, if it is the one held: same namespace, name and UID (the join)."""
        job = self._jobs.get(ref.uid)
        return job if job is not None and job.ref == ref else None

    def _key_of(self, ref: ObjectRef) -> Key | None:
        job = self._job(ref)
        return job.key if job is not None else None


def _namespace(record: Record) -> str:
    return record.key[0] if isinstance(record, JobRecord) else record.namespace


def _named(job: ObjectRef) -> tuple[str, str]:
    """The namespace and the MixedPrecisionJob a Job's name `<job>-a<N>` names (`attempt_named`
    checks the rest)."""
    return job.namespace, job.name.rpartition("-a")[0]


def _asked(pod: PodRecord, grace: int | None) -> PodRecord:
    """`pod` once the operator asked for its deletion (with `grace` seconds; None: its own):
    going, with the shortest grace given, as the API server will show it."""
    shortest = min((g for g in (pod.view.grace, grace) if g is not None), default=None)
    view = replace(pod.view, deleting=True, grace=shortest)
    return pod if view == pod.view else replace(pod, view=view)


def deleted(pod: PodRecord) -> PodRecord:
    """`pod` as kept once the API server removed it: it runs no more and is going (deleted), has
    no address and waits for no node; how it ended stays as last seen."""
    view = replace(pod.view, alive=False, deleting=True, unschedulable_since=None)
    return replace(pod, view=view, ip=None)
