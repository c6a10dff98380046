"""One read of the cluster's room answers every elastic job's count: what is per node (eligible
or not, its free GPUs) is counted once for all jobs that ask the same of the nodes, and each job
then adds back only the GPUs its own pods take, so a tick costs O(nodes + jobs), not
O(nodes x jobs); jobs that ask different things never share a count."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.controller.capacity import Room, free_workers, room_workers
from tests.unit.operator.test_elastic_growth import node, pod, spec

pytestmark = pytest.mark.unit

TWO = {"gpusPerWorker": 2, "minComputeCapability": "8.0"}


class Read(dict[str, Any]):
    """A Node document that counts how often a count reads it."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        Read.reads += 1
        return super().get(key, default)


def reads_for(jobs: int) -> int:
    """The Node document reads of `jobs` elastic jobs' counts over one read of 64 nodes."""
    room = Room.of(
        [Read(node(f"n{i}", 8)) for i in range(64)],
        [pod(f"n{i % 64}", 2, namespace="ml", job=f"j{i}") for i in range(jobs)],
    )
    Read.reads = 0
    for i in range(jobs):
        assert room_workers(spec(), room, namespace="ml", job=f"j{i}") == 64 * 8 - (jobs - 1) * 2
    return Read.reads


def test_the_nodes_are_read_once_a_read_however_many_jobs_count() -> None:
    assert reads_for(200) == reads_for(1), "each job's count read every node"


def test_jobs_that_ask_the_same_share_a_count_and_others_do_not() -> None:
    nodes = [
        node("a", 8, pool="x"),
        node("b", 8, pool="y"),
        {**node("t", 8), "spec": {"taints": [{"key": "p", "effect": "NoSchedule"}]}},
    ]
    pods = [pod("a", 4), pod("a", 2, namespace="ml", job="mine")]
    room = Room.of(nodes, pods)
    asked = [
        ({}, "mine", 12),  # a: 8 - 4 others = 4 (its own 2 are its); b: 8; t: a taint not tolerated
        ({}, "another", 10),  # a: 8 - 6 = 2
        ({"template": {"nodeSelector": {"pool": "y"}}}, "mine", 8),
        ({"resources": TWO}, "mine", 6),  # a: 4 // 2; b: 8 // 2
        ({"resources": TWO}, "another", 5),
        ({"template": {"tolerations": [{"key": "p", "operator": "Exists"}]}}, "another", 18),
    ]
    for over, job, fit in asked:
        assert room_workers(spec(**over), room, namespace="ml", job=job) == fit, (over, job)
        assert free_workers(spec(**over), nodes, pods, namespace="ml", job=job) == fit, "a count alone differs"
    assert len(room.shares) == 4
