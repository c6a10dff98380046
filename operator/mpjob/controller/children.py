"""The child cache's store (`cache.py` holds its lock around every call): attempt Jobs, their
pods and the Job controller's FailedCreate Events, indexed by the MixedPrecisionJob and the Job
they belong to, and how long each is kept.

A Job the API server removed stays while any of its pods does (its attempt is lingering while
one still runs). A pod the API server removed stays as it was last seen, stopped, while its Job
is held (`deleted`): how an attempt ended is written on its pods (the cluster's
DisruptionTarget, the exit code, the trainer's report) while the Job's verdict says only that a
pod failed, and an evicted pod can be gone before the reconcile that ends its attempt runs. It
goes when its index runs again in a new pod (its queue admitted the Job again), or with its Job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpjob.controller.ownership import ObjectRef
from mpjob.controller.records import CreateFailure, JobRecord, Key, PodRecord

Record = JobRecord | PodRecord | CreateFailure


@dataclass(frozen=True)
class Held:
    """What is held of one MixedPrecisionJob's attempt Jobs (a Job removed but lingering too)."""

    jobs: list[JobRecord]
    pods: dict[str, list[PodRecord]]  # by Job UID
    failures: dict[str, CreateFailure | None]  # by Job UID: its latest FailedCreate


class Children:
    def __init__(self) -> None:
        self._jobs: dict[str, JobRecord] = {}  # by Job UID; a deleted one stays while pods remain
        self._keys: dict[Key, set[str]] = {}  # MixedPrecisionJob -> its Jobs' UIDs
        self._pods: dict[str, PodRecord] = {}  # by pod UID
        self._by_job: dict[ObjectRef, set[str]] = {}  # the Job pods name -> their UIDs
        self._failures: dict[ObjectRef, CreateFailure] = {}  # the Job it names -> its latest FailedCreate
        self._gone: set[str] = set()  # pods the API server removed, held as last seen

    def of(self, owner: ObjectRef) -> Held:
        """The attempt Jobs the MixedPrecisionJob `owner` controls, with their pods and failures."""
        jobs = [self._jobs[uid] for uid in self._keys.get((owner.namespace, owner.name), ())]
        jobs = [job for job in jobs if job.owner == owner]
        pods = {job.uid: [self._pods[uid] for uid in self._by_job.get(job.ref, ())] for job in jobs}
        return Held(jobs, pods, {job.uid: self._failures.get(job.ref) for job in jobs})

    def has_job(self, uid: str) -> bool:
        return uid in self._jobs

    def held(self, resource: str) -> dict[str, Record]:
        """What is held of `resource` (jobs, pods, events), by object UID (a copy)."""
        if resource == "events":
            return {f.uid: f for f in self._failures.values()}
        return dict(self._jobs if resource == "jobs" else self._pods)

    def put(self, record: Record) -> Key | None:
        """Keep `record`; the job whose reconcile is due, if any."""
        if isinstance(record, JobRecord):
            old = self._jobs.get(record.uid)
            self._jobs[record.uid] = record
            self._keys.setdefault(record.key, set()).add(record.uid)
            return record.key if record.news(old) else None
        if isinstance(record, PodRecord):
            return self._put_pod(record)
        old_failure, self._failures[record.owner] = self._failures.get(record.owner), record
        news = old_failure is None or old_failure.message != record.message
        return self._key_of(record.owner) if news else None

    def drop(self, resource: str, uid: str, *, last: Record | None = None) -> Key | None:
        """The API server removed the object `uid` of `resource` (`last`: how a pod was when it
        went, if read); the job whose reconcile is due, if any."""
        if resource == "jobs":
            return self._drop_job(uid)
        if resource == "pods":
            return self._drop_pod(uid, last if isinstance(last, PodRecord) else None)
        failure = next((f for f in self._failures.values() if f.uid == uid), None)
        if failure is not None:
            del self._failures[failure.owner]
        return None

    def _put_pod(self, record: PodRecord) -> Key | None:
        old = self._pods.get(record.uid)
        self._pods[record.uid] = record
        if old is not None and old.owner != record.owner:  # an owner reference moved
            self._by_job.get(old.owner, set()).discard(record.uid)
        self._by_job.setdefault(record.owner, set()).add(record.uid)
        for replaced in self._gone_pods(record.owner, index=record.view.index):  # its index runs again
            if replaced != record.uid:
                self._remove_pod(replaced)
        return self._key_of(record.owner) if record.news(old) else None

    def _drop_pod(self, uid: str, last: PodRecord | None) -> Key | None:
        """Keep the removed pod as last seen while its Job is held (else forget it, and its Job
        with it once that is gone too)."""
        pod = self._pods.get(uid)
        if pod is None:
            return None
        job = self._job(pod.owner)
        if job is not None and not job.gone:
            if uid in self._gone:
                return None  # kept already (a relisting lacks it, as it should)
            seen = last if last is not None and last.owner == pod.owner else pod  # `last`: the same UID
            self._pods[uid] = deleted(seen)
            self._gone.add(uid)
            return job.key
        self._remove_pod(uid)
        if job is not None and job.gone and not self._by_job.get(pod.owner):
            self._forget_job(job)
        return job.key if job is not None else None

    def _remove_pod(self, uid: str) -> None:
        pod = self._pods.pop(uid)
        self._gone.discard(uid)
        siblings = self._by_job.get(pod.owner, set())
        siblings.discard(uid)
        if not siblings:
            self._by_job.pop(pod.owner, None)

    def _gone_pods(self, job: ObjectRef, *, index: int | None = None) -> list[str]:
        """The UIDs of `job`'s pods kept after the API server removed them (of one index)."""
        gone = (self._pods[uid] for uid in self._by_job.get(job, ()) if uid in self._gone)
        return [pod.uid for pod in gone if index is None or pod.view.index == index]

    def _drop_job(self, uid: str) -> Key | None:
        job = self._jobs.get(uid)
        if job is None:
            return None
        for gone in self._gone_pods(job.ref):  # kept for the Job's verdict: it has none now
            self._remove_pod(gone)
        if self._by_job.get(job.ref):  # its pods still stop: remember whose they are
            self._jobs[uid] = replace(job, gone=True)
        else:
            self._forget_job(job)
        return job.key

    def _forget_job(self, job: JobRecord) -> None:
        self._jobs.pop(job.uid, None)
        self._failures.pop(job.ref, None)
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


def deleted(pod: PodRecord) -> PodRecord:
    """`pod` as kept once the API server removed it: it runs no more and is going (deleted), has
    no address and waits for no node; how it ended stays as last seen."""
    view = replace(pod.view, alive=False, deleting=True, unschedulable_since=None)
    return replace(pod, view=view, ip=None)
