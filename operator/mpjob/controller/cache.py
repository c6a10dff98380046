"""What the operator knows of its attempt Jobs and pods, kept current by one list + watch per
kind and namespace (as a client-go informer keeps its store), read as raw JSON and kept only as
the few fields the planner reads.

A reconcile reads its children here instead of listing them from the API server, and a change
the planner would act on (a Job's verdict or suspension, a pod's exit or deletion) queues a
reconcile of the MixedPrecisionJob it belongs to.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from mpjob.builders.attempt import LABEL_ATTEMPT, LABEL_JOB, TRAINER_CONTAINER
from mpjob.controller.cluster import raw
from mpjob.planning.reconcile import JobView, PodView

log = logging.getLogger("mpjob.operator.cache")

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
#: A watch request's server-side timeout; the watch is then resumed from its last version.
WATCH_SECONDS = 300

Key = tuple[str, str]  # (namespace, MixedPrecisionJob name)


def pod_view(pod: dict[str, Any]) -> PodView:
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


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What of an attempt Job the planner reads: its verdict and whether it is suspended (its pod
    counts are not worth a reconcile: the pods' own events tell their story)."""

    attempt: int
    finished: str | None
    reason: str | None
    suspended: bool

    def news(self, old: JobRecord | None) -> bool:
        """Whether the planner could decide otherwise now (a verdict, a suspension)."""
        return old != self


def job_record(job: dict[str, Any]) -> JobRecord:
    finished = reason = None
    for cond in (job.get("status") or {}).get("conditions") or []:
        # FailureTarget / SuccessCriteriaMet come first: the Job controller has decided and
        # starts no more pods; the planner still waits for every pod to stop.
        kind = TERMINAL_CONDITIONS.get(cond.get("type"))
        if kind and cond.get("status") == "True" and finished is None:
            finished, reason = kind, cond.get("reason")
    return JobRecord(
        attempt=_attempt(job),
        finished=finished,
        reason=reason,
        suspended=bool((job.get("spec") or {}).get("suspend")),
    )


@dataclass(frozen=True, slots=True)
class PodRecord:
    attempt: int
    view: PodView
    ip: str | None

    @property
    def trigger(self) -> tuple[Any, ...]:
        """What of a pod the planner acts on: whether it runs, how it ended, whether it goes."""
        v = self.view
        return v.alive, v.exit_code, v.platform_reason, v.deleting

    def news(self, old: PodRecord | None) -> bool:
        """A new running pod changes no decision; its exit, deletion or failure does."""
        return (old is None and not self.view.alive) or (old is not None and old.trigger != self.trigger)


def pod_record(pod: dict[str, Any]) -> PodRecord:
    return PodRecord(attempt=_attempt(pod), view=pod_view(pod), ip=(pod.get("status") or {}).get("podIP"))


def _attempt(obj: dict[str, Any]) -> int:
    return int((obj["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "-1"))


def _owner(obj: dict[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB)
    return (meta.get("namespace", ""), job) if job else None


@dataclass(frozen=True)
class Observed:
    jobs: dict[int, JobView]
    lingering: frozenset[int]  # attempts whose Job is gone but some pod still runs
    rank0_ip: dict[int, str]  # attempt -> the running rank-0 pod's IP (its metrics endpoint)


class ChildCache:
    """Attempt Jobs and pods by the MixedPrecisionJob they belong to (label mpjob.dev/job).
    `changed(key)` is called, from a watch thread, when a reconcile of `key` is due."""

    def __init__(self, changed: Callable[[Key], None]) -> None:
        self._changed = changed
        self._lock = threading.Lock()
        self._jobs: dict[Key, dict[str, JobRecord]] = {}
        self._pods: dict[Key, dict[str, PodRecord]] = {}
        self._synced: dict[str, threading.Event] = {}
        self._stop = threading.Event()

    def _kind(self, resource: str) -> tuple[dict[Key, dict[str, Any]], Callable[[dict[str, Any]], Any]]:
        """The store of `resource` (jobs or pods) and the record made of one of its objects."""
        if resource == "jobs":
            return self._jobs, job_record  # type: ignore[return-value]
        return self._pods, pod_record  # type: ignore[return-value]

    # -------------------------------------------------------------- reading
    def observe(self, namespace: str, name: str) -> Observed:
        key = (namespace, name)
        with self._lock:
            jobs = dict(self._jobs.get(key, {}))
            pods = list(self._pods.get(key, {}).values())
        by_attempt: dict[int, list[PodView]] = {}
        rank0_ip: dict[int, str] = {}
        for rec in pods:
            by_attempt.setdefault(rec.attempt, []).append(rec.view)
            if rec.view.index == 0 and rec.view.phase == "Running" and rec.view.alive and rec.ip:
                rank0_ip[rec.attempt] = rec.ip
        views = {
            rec.attempt: JobView(
                index=rec.attempt,
                finished=rec.finished,
                reason=rec.reason,
                pods=tuple(sorted(by_attempt.get(rec.attempt, []), key=lambda p: p.name)),
                suspended=rec.suspended,
            )
            for rec in jobs.values()
        }
        lingering = frozenset(i for i, views_ in by_attempt.items() if i not in views and any(p.alive for p in views_))
        return Observed(views, lingering, rank0_ip)

    def wait_synced(self, timeout: float | None = None) -> bool:
        """Whether every watch has had its first listing (before that, reads see nothing)."""
        return all(event.wait(timeout) for event in list(self._synced.values()))

    # -------------------------------------------------------------- writing
    def record_job(self, job: dict[str, Any]) -> None:
        """A Job this operator just created, as the API server returned it: its ADDED event then
        changes nothing, and a reconcile right after sees it. Never over what the watch has
        already brought (that is newer)."""
        key, uid = _owner(job), job["metadata"]["uid"]
        if key is not None:
            with self._lock:
                self._jobs.setdefault(key, {}).setdefault(uid, job_record(job))

    def apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        """One watch event (`kind` ADDED, MODIFIED or DELETED) of a Job or a pod (`resource`
        jobs or pods); queues a reconcile of its MixedPrecisionJob when it is news."""
        key, uid = _owner(obj), obj["metadata"]["uid"]
        if key is None:
            return
        store, make = self._kind(resource)
        with self._lock:
            records = store.setdefault(key, {})
            old = records.get(uid)
            if kind == "DELETED":
                records.pop(uid, None)
                if not records:
                    del store[key]
                due = True
            else:
                new = make(obj)
                records[uid] = new
                due = new.news(old)
        if due:
            self._changed(key)

    def _replace(
        self, store: dict[Key, dict[str, Any]], namespace: str | None, fresh: dict[Key, dict[str, Any]]
    ) -> set[Key]:
        """Swap in a full listing (first sync, or after the watch fell too far behind)."""
        with self._lock:
            mine = [k for k in store if namespace is None or k[0] == namespace]
            changed = {k for k in mine if store[k] != fresh.get(k)} | {k for k in fresh if store.get(k) != fresh[k]}
            for k in mine:
                del store[k]
            store.update(fresh)
        return changed

    # -------------------------------------------------------------- watching
    def start(self, namespaces: Iterable[str | None], batch: Any, core: Any) -> None:
        """Start a list + watch of attempt Jobs and pods per namespace (None: every namespace)."""
        for namespace in namespaces:
            for kind in ("jobs", "pods"):
                if namespace is None:
                    call = batch.list_job_for_all_namespaces if kind == "jobs" else core.list_pod_for_all_namespaces
                    args: tuple[Any, ...] = ()
                else:
                    call = batch.list_namespaced_job if kind == "jobs" else core.list_namespaced_pod
                    args = (namespace,)
                synced = self._synced.setdefault(f"{kind}/{namespace or '*'}", threading.Event())
                threading.Thread(
                    target=self._list_watch,
                    args=(kind, namespace, call, args, synced),
                    name=f"mpjob-watch-{kind}-{namespace or 'all'}",
                    daemon=True,
                ).start()

    def stop(self) -> None:
        self._stop.set()

    def _list_watch(
        self, kind: str, namespace: str | None, call: Any, args: tuple[Any, ...], synced: threading.Event
    ) -> None:
        store, make = self._kind(kind)
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    listing = raw(call, *args, label_selector=LABEL_JOB)
                    fresh: dict[Key, dict[str, Any]] = {}
                    for obj in listing["items"]:
                        owner = _owner(obj)
                        if owner is not None:
                            fresh.setdefault(owner, {})[obj["metadata"]["uid"]] = make(obj)
                    for key in self._replace(store, namespace, fresh):
                        self._changed(key)
                    version = listing["metadata"]["resourceVersion"]
                    synced.set()
                response = call(
                    *args,
                    label_selector=LABEL_JOB,
                    watch=True,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS,
                    _preload_content=False,
                )
                try:
                    for line in iter_resp_lines(response):
                        if self._stop.is_set():
                            return
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            if obj.get("code") == 410:  # too old a version: list again
                                version = None
                                break
                            raise RuntimeError(f"watch of {kind}: {obj.get('message')}")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.apply(kind, event["type"], obj)
                finally:
                    response.release_conn()
            except ApiException as exc:
                if exc.status == 410:
                    version = None
                    continue
                log.warning("watch of %s failed (%s %s); resuming in 1 s", kind, exc.status, exc.reason)
                self._stop.wait(1)
            except Exception as exc:  # never let one error stop the cache for good
                log.warning("watch of %s failed (%r); listing again in 1 s", kind, exc)
                version = None
                self._stop.wait(1)
