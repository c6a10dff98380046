"""The room an elastic job grows on is read at a bounded cost: one read of the GPU nodes and the
pods (mpjob.controller.capacity.RoomReader) answers every job's reconcile for
a tick, whatever the number of jobs waiting to grow; the API server is asked only for
GPU nodes and for pods bound to a node that have not ended, and only what pods that request GPUs
take is kept, summed by node and by job: a job's count walks the nodes, not every pod again."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.capacity import RoomReader, fits_now
from mpjob.controller.cluster import Cluster
from mpjob.controller.quiet import QUIET_SECONDS
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_elastic_growth import _shrunk, node, pod, spec
from tests.unit.operator.test_elastic_queue import Response

pytestmark = pytest.mark.unit

TICK = 5.0  # the operator's tick (OperatorConfig.tick_seconds): one read answers for it


class Core:
    """Nodes and pods as the API serves them, keeping each LIST's kind and arguments; `error`:
    the status the API server answers instead (403: a chart without rbac.elasticCapacity)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods
        self.error: int | None = None
        self.lists: list[tuple[str, dict[str, Any]]] = []

    def _answer(self, kind: str, items: list[dict[str, Any]], kwargs: dict[str, Any]) -> Response:
        self.lists.append((kind, kwargs))
        if self.error is not None:
            raise ApiException(status=self.error, reason="Refused")
        return Response({"items": items})

    def list_node(self, **kwargs: Any) -> Response:
        return self._answer("nodes", self.nodes, kwargs)

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Response:
        return self._answer("pods", self.pods, kwargs)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.lists if k == kind)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _reader(core: Core, clock: Clock) -> RoomReader:
    return RoomReader(Cluster(custom=None, batch=None, core=core), fresh_seconds=TICK, clock=clock)


JOB = spec()
BELOW: MixedPrecisionJobStatus = _shrunk(JOB)  # attempt 1 runs 2 of its 3 workers


def _fits(reader: RoomReader, job: str, job_spec: MixedPrecisionJobSpec = JOB, status: Any = BELOW) -> int | None:
    return fits_now(reader, job_spec, status, namespace="ml", job=job)


def test_two_jobs_reconciled_in_one_window_share_one_read_and_past_it_a_new_read_sees_the_change() -> None:
    core, clock = (
        Core([node("a", 4)], [pod("a", 2, namespace="ml", job="j1"), pod("a", 1, namespace="ml", job="j2")]),
        Clock(),
    )
    reader = _reader(core, clock)
    assert (_fits(reader, "j1"), _fits(reader, "j2")) == (3, 2)  # each counts its own pods as its
    clock.now = TICK - 0.1
    core.pods = []  # both jobs' pods ended: not seen until the window is over
    assert (_fits(reader, "j1"), _fits(reader, "j2")) == (3, 2)
    assert (core.count("nodes"), core.count("pods")) == (1, 1)
    clock.now = TICK
    assert (_fits(reader, "j2"), _fits(reader, "j1")) == (4, 4)
    assert (core.count("nodes"), core.count("pods")) == (2, 2)


def test_the_api_server_is_asked_for_gpu_nodes_and_bound_pods_not_ended_and_only_gpu_pods_are_kept() -> None:
    others = {"metadata": {"namespace": "web"}, "spec": {"nodeName": "a", "containers": [{}]}, "status": {}}
    core = Core([node("a", 4)], [others, pod("a", 1)])
    room = _reader(core, Clock()).room()
    assert room is not None and dict(room.used) == {"a": 1}  # the web pod requests no GPU
    (nodes, kw_nodes), (pods, kw_pods) = core.lists
    assert (nodes, kw_nodes["label_selector"]) == ("nodes", "nvidia.com/gpu.compute.major")
    assert pods == "pods" and set(kw_pods["field_selector"].split(",")) == {
        "spec.nodeName!=",
        "status.phase!=Succeeded",
        "status.phase!=Failed",
    }


def test_a_refused_read_answers_no_room_and_is_not_asked_again_until_the_quiet_window_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A chart without rbac.elasticCapacity: the 403 is remembered and said once, not asked
    again each tick for every elastic job that waits to grow."""
    core, clock = Core([node("a", 4)], []), Clock()
    core.error = 403
    reader = _reader(core, clock)
    for tick in range(int(QUIET_SECONDS / TICK)):
        clock.now = tick * TICK
        assert (_fits(reader, "j1"), _fits(reader, "j2")) == (None, None)
    assert core.count("nodes") == 1  # not once per job, nor once per tick
    clock.now = QUIET_SECONDS
    assert _fits(reader, "j1") is None and core.count("nodes") == 2  # asked again, still refused
    refusals = [r for r in caplog.records if "403" in r.getMessage()]
    assert len(refusals) == 1 and "nodes and pods" in refusals[0].getMessage()  # said once while it lasts
    core.error, clock.now = None, 2 * QUIET_SECONDS
    assert _fits(reader, "j1") == 4 and core.count("nodes") == 3


def test_a_read_that_failed_for_now_is_asked_again_the_next_window() -> None:
    core, clock = Core([node("a", 4)], []), Clock()
    core.error = 503
    reader = _reader(core, clock)
    assert (_fits(reader, "j1"), _fits(reader, "j2")) == (None, None) and core.count("nodes") == 1
    core.error, clock.now = None, TICK
    assert _fits(reader, "j1") == 4 and core.count("nodes") == 2


def test_a_job_that_does_not_grow_reads_nothing() -> None:
    core = Core([node("a", 4)], [])
    reader = _reader(core, Clock())
    assert _fits(reader, "j", status=MixedPrecisionJobStatus()) is None  # no attempt yet
    assert _fits(reader, "j", spec(elastic=None)) is None
    assert _fits(reader, "j", spec(resources={"gpusPerWorker": 0})) is None
    assert _fits(reader, "j", spec(workers=2)) is None  # at its workers already
    assert core.lists == []


@pytest.mark.parametrize("jobs", [1, 10, 100])
def test_lists_a_minute_stay_one_node_and_one_pod_list_a_window_whatever_the_number_of_jobs(jobs: int) -> None:
    """Every job below its workers reconciled each 5-s tick, spread over the tick, for a minute:
    before the shared read, 2 LISTs per job per tick (240 a minute for 10 jobs)."""
    core, clock = Core([node("a", 4)], [pod("a", 1)]), Clock()
    reader = _reader(core, clock)
    for tick in range(12):
        for job in range(jobs):
            clock.now = tick * TICK + job * (TICK - 0.1) / jobs
            assert _fits(reader, f"j{job}") == 3
    assert (core.count("nodes"), core.count("pods")) == (60 / TICK, 60 / TICK)


class Counted(dict[str, Any]):
    """A pod document that counts the reads of its fields."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        Counted.reads += 1
        return super().get(key, default)


class Listed:
    """The cluster's `gpu_room` answer as documents held here (so that their reads are seen)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        self.nodes, self.pods = nodes, pods

    def gpu_room(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return self.nodes, self.pods


def test_the_pods_are_walked_once_a_read_and_a_jobs_count_reads_its_own_sums_not_every_pod() -> None:
    """One job's count on a room of thousands of pods walked all of them (a tick of N elastic
    jobs below their workers: N x N pods); the read now keeps sums by node and by job."""
    pods = [Counted(pod("a", 1, namespace="ml", job=f"j{i}")) for i in range(3)] + [Counted(pod("b", 2))]
    reader = RoomReader(Listed([node("a", 4), node("b", 4)], pods), fresh_seconds=TICK, clock=Clock())  # type: ignore[arg-type]
    assert _fits(reader, "j0") == 4  # a: 4 less j1's and j2's; b: 4 less 2 (a worker a GPU)
    walked = Counted.reads
    assert [_fits(reader, f"j{i}") for i in range(3)] + [_fits(reader, "other")] == [4, 4, 4, 3]
    assert Counted.reads == walked  # the read's sums answered: no pod read again
    room = reader.room()
    assert room is not None and dict(room.used) == {"a": 3, "b": 2}
    assert {key: dict(nodes) for key, nodes in room.own.items()} == {("ml", f"j{i}"): {"a": 1} for i in range(3)}
