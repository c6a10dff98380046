"""The pods that keep an attempt's NetworkPolicy: it outlives the attempt's Job until the last of
the attempt's pods is gone.

The policy is controlled by its attempt's Job, and a Job the operator deletes (a suspension, a
fallback, a cut) or that goes with its deleted MixedPrecisionJob is removed at once, while its
pods run out their grace period (SIGTERM, then the trainer's checkpoint: up to a minute). With the
Job as its only owner the garbage collector would delete the policy at once, and for that minute
the trainers' rendezvous and Gloo/NCCL ports would be open to every pod of a namespace that has no
default-deny policy. So each pod of the attempt the operator sees running is made an owner of the
policy too (not its controller): the collector deletes an object only once none of its owners is
left, so the policy goes with the attempt's last pod.

Each pod is added once (remembered in memory: a restarted operator adds them again, which changes
nothing), to a policy read first: only one the attempt's Job controls (`Claim.OURS`), written at the
version read (a 409, a policy not made yet, a server error: the next reconcile tries again; a
403, from a chart that grants no `patch`, is logged once and left as it was before).
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from mpjob.builders.attempt import attempt_name
from mpjob.controller.cache import Observed
from mpjob.controller.cluster import CONFLICT, NOT_FOUND, Cluster, raw
from mpjob.controller.ownership import Claim, claim
from mpjob.controller.records import Key

log = logging.getLogger("mpjob.operator")

MERGE_PATCH = "application/merge-patch+json"
FORBIDDEN = 403


class PolicyKeepers:
    """By job, by attempt: the pods made owners of the attempt's NetworkPolicy so far."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.kept: dict[Key, dict[int, frozenset[str]]] = {}

    def keep(self, key: Key, seen: Observed) -> None:
        """Make each running pod of the job's held, unfinished Jobs an owner of its attempt's
        policy (those not made so already); before anything of the reconcile deletes a Job."""
        kept = {i: uids for i, uids in self.kept.get(key, {}).items() if i in seen.jobs}
        for index, view in sorted(seen.jobs.items()):
            job_uid, pods = seen.uids.get(index), {p.uid: p.name for p in view.pods if p.alive and p.uid}
            new = pods.keys() - kept.get(index, frozenset())
            if job_uid is None or view.finished or not new:
                continue
            if self._add_owners(key, index, job_uid, {uid: pods[uid] for uid in new}):
                kept[index] = kept.get(index, frozenset()) | new
        if kept:
            self.kept[key] = kept
        else:
            self.kept.pop(key, None)

    def forget(self, key: Key) -> None:
        self.kept.pop(key, None)

    def _add_owners(self, key: Key, index: int, job_uid: str, pods: dict[str, str]) -> bool:
        """Add `pods` (UID -> name) to the owners of attempt `index`'s policy, if the Job of UID
        `job_uid` controls it; whether this is settled (made, or not to be tried again)."""
        (namespace, job), networking = key, self.cluster.networking
        name = attempt_name(job, index)
        try:
            policy = raw(networking.read_namespaced_network_policy, name, namespace)
            meta = policy.get("metadata") or {}
            if claim(policy, owners={job_uid: ("Job", name)}) is not Claim.OURS:
                return True  # not this Job's: never written (its attempt fails, NameConflict)
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "ownerReferences": _with(meta, pods)}}
            raw(networking.patch_namespaced_network_policy, name, namespace, body, _content_type=MERGE_PATCH)
        except ApiException as exc:
            if exc.status in (NOT_FOUND, CONFLICT):
                return False
            settled = exc.status == FORBIDDEN  # a chart from before pods kept policies: as it was then
            log.warning("%s/%s: its pods not made owners of the NetworkPolicy: %s", namespace, name, exc.reason)
            return settled
        except HTTPError as exc:  # a timeout: never in the way of the reconcile's own acts
            log.warning("%s/%s: its pods not made owners of the NetworkPolicy: %s", namespace, name, exc)
            return False
        return True


def _with(meta: dict[str, Any], pods: dict[str, str]) -> list[dict[str, Any]]:
    """The object's ownerReferences with the pods `pods` (UID -> name) among them."""
    refs = [ref for ref in meta.get("ownerReferences") or [] if isinstance(ref, dict)]
    have = {ref.get("uid") for ref in refs}
    return refs + [{"apiVersion": "v1", "kind": "Pod", "name": n, "uid": u} for u, n in pods.items() if u not in have]
