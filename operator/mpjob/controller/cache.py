"""What the operator knows of its attempt Jobs, their pods and the Job controller's FailedCreate
Events, kept current by one list + watch per kind and namespace (as a client-go informer keeps
its store; `watch.py`), read as raw JSON and kept only as the few fields the planner reads
(`records.py`).

A reconcile reads its children here, not from the API server; a change the planner would act on
(a Job's verdict or suspension, a pod's start, exit or deletion, a pod the Job controller cannot
create) queues a reconcile of the MixedPrecisionJob it belongs to. What is kept, and for how
long (a removed pod stays as last seen while its Job is held), is `children.py`'s.
Children are found by their controller ownerReferences, never by label alone, and joined to
their parent on namespace, kind, name and UID together (`ownership.ObjectRef`): a pod or Event of
another namespace that copies a Job's name and UID joins nothing. A pod its Job left behind when
it was deleted with --cascade=orphan has no ownerReference left: the Job controller's labels name
its Job (`records.orphan_owner`), it joins one held on the same four, and it is deleted
(`Observed.orphans`) as the Job's own deletion would have deleted it. A Job removed before this operator
listed it (it restarted meanwhile) whose pods are still there, still stopping or orphaned, is
held as removed when the MixedPrecisionJob's status records its UID (`status.attempts[].jobUid`,
`children.Children.adopt`): its pods are read and charged once stopped. One exception, which can
only make an attempt wait: a running pod of an attempt's name whose Job is not known so is
lingering for the attempt its Job's name names (`children.Children._strays`). An unreadable
object is skipped (and logged once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mpjob.builders.attempt import LABEL_JOB
from mpjob.controller.children import Children, Record
from mpjob.controller.create_failures import create_failure
from mpjob.controller.lostnodes import Nodes, on_nodes
from mpjob.controller.ownership import Malformed, ObjectRef
from mpjob.controller.records import JobRecord, Key, PodRecord, job_record, pod_record
from mpjob.controller.watch import ListWatch, Source
from mpjob.planning.history import HeldJob
from mpjob.planning.reconcile import JobView, PodView
from mpjob_contract import api

log = logging.getLogger("mpjob.operator.cache")

#: The Events worth watching: the Job controller's pods it could not create.
FAILED_CREATE = "involvedObject.kind=Job,reason=FailedCreate"
MAKERS: dict[str, Callable[[dict[str, Any]], Record | None]] = {
    "jobs": job_record,
    "pods": pod_record,
    "events": create_failure,
}


@dataclass(frozen=True)
class Observed:
    jobs: dict[int, JobView]
    #: attempts whose Job is gone but some pod still runs (also one whose Job this operator never
    #: saw: removed before it listed, while it restarted; `children.Children._strays`)
    lingering: frozenset[int]
    rank0_ip: dict[int, str]  # attempt -> the running rank-0 pod's IP (its metrics endpoint)
    uids: dict[int, str]  # attempt -> its Job's UID (deletes carry it as a precondition)
    #: attempt -> its Job that is gone, whose pods have all stopped (as last seen: `children.py`)
    stopped: dict[int, JobView] = field(default_factory=dict)
    #: Pods a Job of this job's left behind when it was deleted (--cascade=orphan), not yet
    #: deleted: they are stopped as the Job's deletion would have stopped them (`orphans_of`).
    orphans: dict[int, tuple[PodView, ...]] = field(default_factory=dict)  # by attempt

    def held(self) -> dict[int, HeldJob]:
        """By attempt, its Job's UID and making (`history.strays`, `history.own`)."""
        return {i: HeldJob(uid, view.created if (view := self.jobs.get(i)) else None) for i, uid in self.uids.items()}


NOTHING_SEEN = Observed({}, frozenset(), {}, {})


class ChildCache:
    """Attempt Jobs, pods and FailedCreate Events by the MixedPrecisionJob they belong to.
    `changed(key)` is called, from a watch thread, when a reconcile of `key` is due."""

    def __init__(self, changed: Callable[[Key], None]) -> None:
        self._changed = changed
        self._lock = threading.Lock()
        self._children = Children()  # read and written under the lock
        self._skipped: set[str] = set()  # UIDs of objects already logged as unreadable
        self._synced: dict[str, threading.Event] = {}
        self._watches: list[ListWatch] = []
        self._stop = threading.Event()

    # -------------------------------------------------------------- reading
    def observe(
        self,
        namespace: str,
        name: str,
        uid: str,
        nodes: Nodes | None = None,
        *,
        recorded: Mapping[int, str] | None = None,
    ) -> Observed:
        """The attempts of the MixedPrecisionJob `namespace/name` whose UID is `uid` (with `nodes`,
        the Nodes as listed: a pod running on one gone or unreachable is lost, lostnodes.on_nodes;
        `recorded`: the UIDs of its attempts' Jobs its status records, `children.Children.adopt`)."""
        owner = ObjectRef(namespace, api.KIND, name, uid)
        with self._lock:
            self._children.adopt(owner, recorded or {})
            held = self._children.of(owner)
        pods = {job: [on_nodes(p.view, nodes) for p in records] for job, records in held.pods.items()}
        views: dict[int, JobView] = {}
        rank0_ip: dict[int, str] = {}
        uids: dict[int, str] = {}
        for job in (j for j in held.jobs if not j.gone):
            failure = held.failures[job.uid]
            views[job.attempt] = _view(job, pods[job.uid], failure.message if failure is not None else None)
            uids[job.attempt] = job.uid
            if (ip := _rank0_ip(held.pods[job.uid])) is not None:
                rank0_ip[job.attempt] = ip
        gone = [j for j in held.jobs if j.gone]
        strays = {a: [on_nodes(p.view, nodes) for p in records] for a, records in held.strays.items()}
        lingering = frozenset(j.attempt for j in gone if any(p.alive for p in pods[j.uid])) | frozenset(
            a for a, stray in strays.items() if any(p.alive for p in stray)
        )
        stopped = {j.attempt: _view(j, pods[j.uid], None) for j in gone if j.attempt not in lingering}
        return Observed(views, lingering, rank0_ip, uids, stopped, orphans_of(gone, held.pods))

    def forget_gone(self, namespace: str, name: str) -> None:
        """The MixedPrecisionJob `namespace/name` is gone: so are its removed Jobs that were kept
        for what their pods said when they stopped (`children.py`)."""
        with self._lock:
            self._children.forget_gone((namespace, name))

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether every watch has had its first listing (before that, reads see nothing)."""
        return all(event.wait(timeout) for event in list(self._synced.values()))

    # -------------------------------------------------------------- writing
    def record_job(self, job: dict[str, Any]) -> None:
        """A Job this operator just created, as the API server returned it: its ADDED event then
        changes nothing, and a reconcile right after sees it. Never over what the watch has
        already brought (that is newer)."""
        record = job_record(job)
        if record is not None:
            with self._lock:
                if not self._children.has_job(record.uid):
                    self._children.put(record)

    def stopping(self, pods: Iterable[PodView], grace: int | None = None) -> None:
        """The operator asked for the deletion of `pods` (with `grace` seconds; None: their own):
        none is to be stopped again (and said again) by a reconcile that runs before the watch
        shows it going."""
        with self._lock:
            self._children.deleting((pod.uid for pod in pods), grace)

    def removing(self, job: str) -> None:
        """The operator deleted the Job whose UID is `job`: a reconcile before the watch shows it
        gone sees it as removed (`children.Children.removing`)."""
        with self._lock:
            self._children.removing(job)

    def apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (`kind` ADDED, MODIFIED or DELETED) of a Job, pod or Event
        (`resource` jobs, pods or events); queues a reconcile of its job when it is news."""
        uid = (obj.get("metadata") or {}).get("uid")
        if not isinstance(uid, str):
            return
        if kind == "DELETED":
            last = self._read(resource, obj) if resource == "pods" else None  # how it was when it went
            with self._lock:
                due = self._children.drop(resource, uid, last=last)
                self._skipped.discard(uid)
        else:
            record = self._read(resource, obj)
            if record is None:
                return
            with self._lock:
                due = self._children.put(record)
        if due is not None:
            self._changed(due)

    def relist(self, resource: str, namespace: str | None, objects: Iterable[dict[str, Any]]) -> None:
        """Swap in a full listing of `resource` in `namespace` (None: all): the first sync, or
        after the watch fell too far behind. Queues every job whose children changed."""
        fresh = {r.uid: r for r in (self._read(resource, obj) for obj in objects) if r is not None}
        with self._lock:
            due = self._children.relist(resource, namespace, fresh)
        for key in due:
            self._changed(key)

    def _read(self, resource: str, obj: dict[str, Any]) -> Record | None:
        """The record of `obj`, or None when it is not an attempt's child or cannot be read
        (logged once per object: a forged or damaged object never breaks a watch)."""
        try:
            return MAKERS[resource](obj)
        except (Malformed, KeyError, TypeError, ValueError, AttributeError) as exc:
            meta = obj.get("metadata") if isinstance(obj, dict) else None
            uid = str((meta or {}).get("uid"))
            if uid not in self._skipped:
                self._skipped.add(uid)
                name = f"{(meta or {}).get('namespace')}/{(meta or {}).get('name')}"
                log.warning("skipping %s %s: %s", resource.removesuffix("s"), name, exc)
            return None

    # -------------------------------------------------------------- watching
    def start(self, namespaces: Iterable[str | None], batch: Any, core: Any) -> None:
        """Start a list + watch of attempt Jobs, pods and FailedCreate Events per namespace
        (None: every namespace)."""
        for namespace in namespaces:
            for source in sources(namespace, batch=batch, core=core):
                synced = self._synced.setdefault(f"{source.resource}/{namespace or '*'}", threading.Event())
                watch = ListWatch(source, cache=self, synced=synced, stop=self._stop)
                watch.start()  # kept once started: a stop joins it (a thread that failed to start is not)
                self._watches.append(watch)

    def dead_watches(self) -> list[str]:
        """Why each dead list + watch is dead (the liveness probe's; `ListWatch.dead`)."""
        return [reason for reason in (w.dead() for w in self._watches) if reason is not None]

    def stop(self, timeout: float = 0.0) -> list[str]:
        """Stop every list + watch and wait up to `timeout` s in all for them to end; the names of
        those still running (in a request the API server has not answered: they end with the
        process, never running Python again while it finalizes)."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for watch in self._watches:
            watch.join(max(0.0, deadline - time.monotonic()))
        return [watch.name for watch in self._watches if watch.is_alive()]


def sources(namespace: str | None, *, batch: Any, core: Any) -> list[Source]:
    """The three list + watches of one namespace (None: all namespaces). Labels and field
    selectors narrow what the API server sends; ownership is checked here."""
    everywhere = namespace is None
    return [
        Source(
            resource="jobs",
            namespace=namespace,
            call=batch.list_job_for_all_namespaces if everywhere else batch.list_namespaced_job,
            selectors={"label_selector": LABEL_JOB},
            group="batch",
        ),
        Source(
            resource="pods",
            namespace=namespace,
            call=core.list_pod_for_all_namespaces if everywhere else core.list_namespaced_pod,
            selectors={"label_selector": LABEL_JOB},
        ),
        Source(
            resource="events",
            namespace=namespace,
            call=core.list_event_for_all_namespaces if everywhere else core.list_namespaced_event,
            selectors={"field_selector": FAILED_CREATE},
        ),
    ]


def _view(job: JobRecord, pods: list[PodView], create_error: str | None) -> JobView:
    """What the planner reads of the attempt Job `job` with its `pods`."""
    return JobView(
        index=job.attempt,
        uid=job.uid,
        finished=job.finished,
        reason=job.reason,
        pods=tuple(sorted(pods, key=lambda p: p.name)),
        suspended=job.suspended,
        suspended_since=job.suspended_since,
        create_error=create_error,
        generation=job.generation,
        created=job.created,
        workers=job.workers,
    )


def orphans_of(gone: list[JobRecord], pods: dict[str, list[PodRecord]]) -> dict[int, tuple[PodView, ...]]:
    """By attempt, the pods still there that the deleted Jobs `gone` (held: of this very UID, so
    this operator made them) left behind without an owner, and that nobody deletes yet. Nothing
    else would ever stop them: the attempt would wait for them for good (an operator that restarts
    knows their Job's UID only from the status: `children.Children.adopt`)."""
    left = {
        job.attempt: tuple(sorted((p.view for p in pods[job.uid] if p.orphan and not p.view.deleting), key=_name))
        for job in gone
    }
    return {attempt: views for attempt, views in left.items() if views}


def _name(view: PodView) -> str:
    return view.name


def _rank0_ip(pods: list[PodRecord]) -> str | None:
    """The address of the Job's running rank-0 pod (its metrics endpoint), if any."""
    for pod in pods:
        view: PodView = pod.view
        if view.index == 0 and view.phase == "Running" and view.alive and pod.ip:
            return pod.ip
    return None
