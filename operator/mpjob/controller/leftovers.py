"""What an attempt's Job leaves behind when it is deleted with --cascade=orphan: the garbage
collector takes the Job's ownerReference off its children, and nothing would ever delete them.
Its pods run on (`cache.Observed.orphans`: the attempt would wait for them, two trainers would
write checkpoints if it did not), and its headless Service and NetworkPolicy keep the attempt's
name, which the Job made again in the same attempt needs (one of that name mpjob does not own
fails the attempt, NameConflict).

The operator deletes them, each with its UID as a precondition, only for a Job it held, or
whose UID the job's status records (`status.attempts[].jobUid`: after a restart), of that very
UID, so it made it, that left pods behind: the evidence that a deletion orphaned its children.
The pods go with their own grace (the trainer checkpoints on SIGTERM); the Service and
NetworkPolicy of the Job's name only when they have no controller and carry the attempt's labels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException

from mpjob.builders.attempt import LABEL_ATTEMPT, LABEL_JOB, attempt_name
from mpjob.controller.cluster import CONFLICT, NOT_FOUND, REQUEST_TIMEOUT, Cluster, raw
from mpjob.controller.ownership import Malformed, controller_of
from mpjob.planning.endings import PodView

log = logging.getLogger("mpjob.operator")


def stop(
    cluster: Cluster, namespace: str, job: str, orphans: Mapping[int, tuple[PodView, ...]], *, policies: bool
) -> list[PodView]:
    """Delete what the deleted Jobs of the attempts in `orphans` left behind (their NetworkPolicy
    too with `policies`: the operator makes one); the pods this deleted (not those gone already,
    nor one whose name another pod has taken): `cutoff.orphans_event` names them."""
    if not orphans:
        return []
    core, stopped = cluster.core, list[PodView]()
    for index, pods in sorted(orphans.items()):
        mine = {LABEL_JOB: job, LABEL_ATTEMPT: str(index)}
        name = attempt_name(job, index)
        _release(core.read_namespaced_service, core.delete_namespaced_service, namespace, name, mine)
        if policies:
            networking = cluster.networking
            read, delete = networking.read_namespaced_network_policy, networking.delete_namespaced_network_policy
            _release(read, delete, namespace, name, mine)
        for pod in pods:  # last: while one is there, a failed release above is tried again
            if _delete(core.delete_namespaced_pod, namespace, pod.name, pod.uid):
                stopped.append(pod)
    return stopped


def _release(
    read: Callable[..., Any], delete: Callable[..., Any], namespace: str, name: str, mine: dict[str, str]
) -> None:
    """Delete the object `name` when it has no controller and carries the labels `mine`."""
    try:
        existing = raw(read, name, namespace)
    except ApiException as exc:
        if exc.status == NOT_FOUND:
            return
        raise
    meta = existing.get("metadata") or {}
    labels = meta.get("labels") or {}
    try:
        ownerless = controller_of(meta) is None
    except Malformed:
        ownerless = False
    if ownerless and isinstance(labels, dict) and all(labels.get(k) == v for k, v in mine.items()):
        _delete(delete, namespace, name, str(meta.get("uid", "")))
    else:
        log.info("%s/%s: not left by its attempt's Job: kept", namespace, name)


def _delete(delete: Callable[..., Any], namespace: str, name: str, uid: str) -> bool:
    """Delete `name` if it is still the object of UID `uid` (its own grace period, if a pod);
    whether it was."""
    try:
        delete(name, namespace, body={"preconditions": {"uid": uid}}, _request_timeout=REQUEST_TIMEOUT)
    except ApiException as exc:
        if exc.status not in (NOT_FOUND, CONFLICT):  # gone, or another object took the name
            raise
        return False
    return True
