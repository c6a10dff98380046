"""What a test or benchmark does to a running attempt on the test cluster as the cluster would:
find one rank's pod, and lose it as the taint manager does when its node stays unreachable (the
pod's DisruptionTarget condition, reason DeletionByTaintManager, then its deletion)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

GONE = {
    "type": "DisruptionTarget",
    "status": "True",
    "reason": "DeletionByTaintManager",
    "message": "Taint manager: deleting due to NoExecute taint",
}


def rank_pod(core: Any, namespace: str, job: str, attempt: int, rank: int) -> Any:
    """The pod of `rank` in attempt `attempt` of the MixedPrecisionJob `job`."""
    selector = f"mpjob.dev/job={job},mpjob.dev/attempt={attempt}"
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    (pod,) = [p for p in pods if p.metadata.name.startswith(f"{job}-a{attempt}-{rank}-")]
    return pod


def lose_pod(core: Any, namespace: str, name: str) -> float:
    """The pod shown lost by the taint manager, then deleted (it gets its grace period); the
    moment of the deletion (Unix seconds)."""
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(
        name, namespace, {"status": {"conditions": [{**GONE, "lastTransitionTime": stamp}]}}
    )
    deleted = time.time()
    core.delete_namespaced_pod(name, namespace)
    return deleted
