"""spec.elastic grows back on a cluster: the workers the GPU nodes hold (free GPUs, the job's
own pods counted as its), and the reconcile that ends a smaller attempt ScaledUp at its first
checkpoint past the step where more workers began to fit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from mpjob.controller.capacity import free_workers
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.planner import BatchShape
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus

pytestmark = pytest.mark.unit


def spec(**over: Any) -> MixedPrecisionJobSpec:
    doc: dict[str, Any] = {
        "workers": 3,
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 4},
        "elastic": {"minWorkers": 1, "waitSeconds": 60},
        "resources": {"gpusPerWorker": 1, "minComputeCapability": "8.0"},
    }
    return MixedPrecisionJobSpec.model_validate({**doc, **over})


def node(name: str, gpus: int, *, major: str = "9", ready: str = "True", **labels: str) -> dict[str, Any]:
    gfd = {"nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": "0", **labels}
    return {
        "metadata": {"name": name, "labels": gfd},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": ready}]},
    }


def pod(node_name: str, gpus: int, *, namespace: str = "other", job: str | None = None, phase: str = "Running") -> Any:
    labels = {"mpjob.dev/job": job} if job else {}
    resources = {"requests": {"nvidia.com/gpu": str(gpus)}}
    return {
        "metadata": {"namespace": namespace, "labels": labels},
        "spec": {"nodeName": node_name, "containers": [{"resources": resources}]},
        "status": {"phase": phase},
    }


NODES = [node("a", 2), node("b", 2), node("old", 4, major="7"), node("down", 4, ready="False")]
# (id, spec overrides, pods, workers that fit)
TABLE: list[tuple[str, dict[str, Any], list[Any], int | None]] = [
    ("empty-cluster", {}, [], 4),
    ("others-take-gpus", {}, [pod("a", 1), pod("b", 2)], 1),
    ("ended-pods-free-theirs", {}, [pod("a", 2, phase="Succeeded"), pod("b", 2, phase="Failed")], 4),
    ("own-pods-count-as-its", {}, [pod("a", 1, namespace="ml", job="j"), pod("b", 1, namespace="ml", job="j")], 4),
    ("two-gpus-a-worker", {"resources": {"gpusPerWorker": 2, "minComputeCapability": "8.0"}}, [pod("a", 1)], 1),
    ("node-selector", {"template": {"nodeSelector": {"pool": "x"}}}, [], 0),
    ("cpu-job-has-no-count", {"resources": {"gpusPerWorker": 0}}, [], None),
]


@pytest.mark.parametrize(("over", "pods", "fit"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_workers_that_fit_on_free_gpus(over: dict[str, Any], pods: list[Any], fit: int | None) -> None:
    assert free_workers(spec(**over), NODES, pods, namespace="ml", job="j") == fit


def tainted(taint: dict[str, str]) -> dict[str, Any]:
    return {**node("t", 2), "spec": {"taints": [taint]}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL_TAINT = {"key": "pool", "value": "x", "effect": "NoSchedule"}
# (id, the node's taint, template.tolerations, workers that fit on it)
TAINTS: list[tuple[str, dict[str, str], list[dict[str, str]], int]] = [
    ("gpu-taint-tolerated-by-the-operator", GPU_TAINT, [], 2),
    ("untolerated-taint-holds-none", POOL_TAINT, [], 0),
    ("exists-toleration", POOL_TAINT, [{"key": "pool", "operator": "Exists"}], 2),
    ("equal-toleration", POOL_TAINT, [{"key": "pool", "operator": "Equal", "value": "x", "effect": "NoSchedule"}], 2),
    ("other-value", POOL_TAINT, [{"key": "pool", "operator": "Equal", "value": "y"}], 0),
    ("other-effect", POOL_TAINT, [{"key": "pool", "operator": "Exists", "effect": "NoExecute"}], 0),
    ("no-execute", {**POOL_TAINT, "effect": "NoExecute"}, [], 0),
    ("prefer-is-soft", {**POOL_TAINT, "effect": "PreferNoSchedule"}, [], 2),
    ("tolerate-everything", POOL_TAINT, [{"operator": "Exists"}], 2),
]


@pytest.mark.parametrize(("taint", "tolerations", "fit"), [r[1:] for r in TAINTS], ids=[r[0] for r in TAINTS])
def test_a_tainted_node_counts_only_for_pods_that_tolerate_it(
    taint: dict[str, str], tolerations: list[dict[str, str]], fit: int
) -> None:
    job = spec(template={"tolerations": tolerations})
    assert free_workers(job, [tainted(taint)], [], namespace="ml", job="j") == fit


T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def _at(job: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, jobs: dict, at: int, **kw: Any) -> Plan:
    return reconcile(job, status, 1, jobs, T0 + timedelta(seconds=at), **kw)


def _shrunk(job: MixedPrecisionJobSpec) -> MixedPrecisionJobStatus:
    """The job after attempt 0 lost a node: attempt 1 runs with 2 workers, training."""
    first = _at(job, MixedPrecisionJobStatus(), {}, 0)
    lost = (
        PodView("p0", 0, "Failed", False, exit_code=143),
        PodView("p2", 2, "Failed", False, platform_reason="NodeLost"),
    )
    ended = _at(job, first.status, {0: JobView(0, pods=(PodView("p1", 1, "Failed", False, exit_code=143), *lost))}, 5)
    assert ended.create[0].workers == 2  # one of three nodes lost
    status = ended.status
    status.step = 20
    return status


RUNNING = {1: JobView(1, pods=(PodView("q0", 0, "Running", True),))}


def test_a_smaller_attempt_grows_at_its_first_checkpoint_after_room_returns() -> None:
    job = spec()
    status = _shrunk(job)
    assert not _at(job, status, RUNNING, 10, fits=2).delete  # still no room
    noticed = _at(job, status, RUNNING, 20, fits=3)
    assert noticed.status.grow_after_step == 20 and not noticed.delete
    status = noticed.status
    status.last_checkpoint = CheckpointStatus(step=20)
    assert not _at(job, status, RUNNING, 30, fits=3).delete  # a checkpoint from before: wait for the next
    status.last_checkpoint, status.step = CheckpointStatus(step=30), 33
    grown = _at(job, status, RUNNING, 40, fits=3)
    assert grown.delete == [1] and not grown.create  # created once attempt 1's pods are gone
    assert grown.cut == []  # whole ranks: their SIGTERM checkpoint gets the pods' full grace period
    ended, nxt = grown.status.attempts[-2:]
    assert (ended.reason, ended.charged, nxt.world_size, grown.status.workers) == ("ScaledUp", False, 3, 3)
    assert grown.status.grow_after_step is None
    created = _at(job, grown.status, {}, 45).create
    assert [(c.workers, c.shape) for c in created] == [(None, BatchShape(4, 1))]


def test_room_that_goes_again_before_the_checkpoint_cancels_the_growth() -> None:
    job = spec()
    status = _shrunk(job)
    status = _at(job, status, RUNNING, 20, fits=3).status
    assert status.grow_after_step == 20
    assert _at(job, status, RUNNING, 30, fits=2).status.grow_after_step is None


def test_no_growth_at_the_final_checkpoint_the_attempt_ends_succeeded_there() -> None:
    """Room that returns just before the end: the checkpoint that would stop the attempt is the
    job's last, so it ends Succeeded there; growing would start a bigger attempt with no step left."""
    job = spec(training={"batchSize": 4, "steps": 40})
    status = _at(job, _shrunk(job), RUNNING, 20, fits=3).status
    assert status.grow_after_step == 20
    status.last_checkpoint, status.step = CheckpointStatus(step=40), 40
    kept = _at(job, status, RUNNING, 40, fits=3)
    assert not kept.delete and not kept.create and kept.status.attempts[-1].reason is None


def test_an_attempt_after_a_fault_starts_at_the_size_the_cluster_holds_again() -> None:
    """A smaller attempt that had seen room return ends NumericFault before its growth: the next
    attempt starts with the workers the cluster holds now (a stale growAfterStep would otherwise
    end it ScaledUp at its first reading, one restart more), and the marker goes with the attempt."""
    job = spec(precision={"mode": "fp16", "fallback": ["bf16"]})
    status = _at(job, _shrunk(job), RUNNING, 20, fits=3).status
    assert status.grow_after_step == 20
    status.last_checkpoint, status.step = CheckpointStatus(step=20), 25
    fault = JobView(1, "Failed", "BackoffLimitExceeded", pods=(PodView("q0", 0, "Failed", False, exit_code=42),))
    ended = _at(job, status, {1: fault}, 30, fits=3)
    assert ended.status.attempts[-2].reason == "NumericFault"
    (created,) = ended.create
    assert (created.precision, created.workers, created.shape) == ("bf16", None, BatchShape(4, 1))
    assert ended.status.grow_after_step is None
    kept = _at(job, ended.status, {2: JobView(2, pods=(PodView("r0", 0, "Running", True),))}, 40, fits=3)
    assert not kept.delete and kept.status.attempts[-1].reason is None


def test_an_attempt_after_a_fault_keeps_its_smaller_size_when_the_room_is_not_back() -> None:
    job = spec(precision={"mode": "fp16", "fallback": ["bf16"]})
    status = _shrunk(job)
    fault = JobView(1, "Failed", "BackoffLimitExceeded", pods=(PodView("q0", 0, "Failed", False, exit_code=42),))
    (created,) = _at(job, status, {1: fault}, 30, fits=2).create
    assert (created.precision, created.workers) == ("bf16", 2)


def test_an_attempt_after_running_out_of_memory_never_grows_into_the_micro_batch_that_ran_out() -> None:
    """18 samples a step (3 workers x 6): on 2 workers 9 a process, in micro-batches of 3. The
    smaller attempt runs out of GPU memory at 3 while the cluster holds 3 workers again: the next
    attempt takes no micro-batch of 3 or more (the 3-worker split of batchSize 6 is 3 x 2, the one
    that ran out), so it goes on split at its size and grows at its checkpoint below 3."""
    job = spec(training={"batchSize": 6})
    status = _shrunk(job)
    assert (status.attempts[-1].micro_batch, status.attempts[-1].grad_accumulation) == (3, 3)
    oom = JobView(1, "Failed", "BackoffLimitExceeded", pods=(PodView("q0", 0, "Failed", False, exit_code=46),))
    ended = _at(job, status, {1: oom}, 30, fits=3)
    assert ended.status.attempts[-2].reason == "OutOfDeviceMemory"
    planned = ended.status.attempts[-1]  # its Job waits out the failure's backoff
    assert planned.micro_batch is not None and planned.micro_batch < 3, planned
    status = ended.status
    status.step, status.last_checkpoint = 30, CheckpointStatus(step=30)
    running = {2: JobView(2, pods=(PodView("r0", 0, "Running", True),))}
    status = _at(job, status, running, 40, fits=3).status
    status.step, status.last_checkpoint = 40, CheckpointStatus(step=40)
    grown = _at(job, status, running, 50, fits=3)
    assert [a.reason for a in grown.status.attempts[-2:]] == ["ScaledUp", None]
    (bigger,) = _at(job, grown.status, {}, 60).create
    assert (bigger.workers, bigger.shape) == (None, BatchShape(2, 3))
