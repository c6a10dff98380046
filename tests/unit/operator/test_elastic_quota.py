"""spec.elastic under a ResourceQuota of the job's namespace: an attempt some of whose pods the
quota keeps the Job controller from creating shrinks to the pods made once it has waited past
waitSeconds (any other refusal only waits), and growth on the nodes' free GPUs is capped by the
workers the quotas hold (`quota_workers`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from mpjob.controller.quotas import quota_workers, worker_demand
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.planner import BatchShape
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_elastic import spec

pytestmark = pytest.mark.unit

REFUSED = (
    'pods "q-a0-2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=1, '
    "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)
WEBHOOK = 'admission webhook "policy.example.com" denied the request: no hostPath'


def _gpu_spec(**over: Any) -> MixedPrecisionJobSpec:
    return spec(**{"resources": {"gpusPerWorker": 1}, **over})


def _reconcile(job: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, jobs: dict, at: int) -> Plan:
    return reconcile(job, status, 1, jobs, datetime(2026, 11, 28, 12, 0, tzinfo=UTC) + timedelta(seconds=at))


def _made(count: int, error: str | None) -> dict[int, JobView]:
    pods = tuple(PodView(f"p{i}", i, "Running", True) for i in range(count))
    return {0: JobView(index=0, pods=pods, create_error=error)}


def test_pods_a_quota_refuses_past_wait_seconds_shrink_the_attempt_to_the_pods_made() -> None:
    job = _gpu_spec()
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    waiting = _reconcile(job, plan.status, _made(2, REFUSED), 50)  # within waitSeconds=60
    assert not waiting.delete and len(waiting.status.attempts) == 1
    assert any(c.type == "PodsCreated" and c.status == "False" for c in waiting.status.conditions)
    shrunk = _reconcile(job, waiting.status, _made(2, REFUSED), 70)
    assert shrunk.delete == [0]
    first, second = shrunk.status.attempts
    assert (first.reason, first.charged, second.world_size, second.workers) == ("ScaledDown", False, 2, 2)
    assert "pods refused by a ResourceQuota for 70s" in (first.message or "")
    assert "the namespace's ResourceQuota holds 2 worker(s): 3 -> 2" in (first.message or "")
    created = _reconcile(job, shrunk.status, {}, 80).create
    assert [(c.index, c.workers, c.shape) for c in created] == [(1, 2, BatchShape(3, 2))]


@pytest.mark.parametrize(
    ("over", "error", "made"),
    [({}, WEBHOOK, 2), ({"elastic": None}, REFUSED, 2), ({}, REFUSED, 3)],
    ids=["another-refusal-only-waits", "not-elastic", "every-pod-made"],
)
def test_no_shrink_without_an_elastic_job_short_of_pods_a_quota_refuses(
    over: dict[str, Any], error: str, made: int
) -> None:
    job = _gpu_spec(**over)
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    later = _reconcile(job, plan.status, _made(made, error), 70)
    assert not later.delete and len(later.status.attempts) == 1


def test_fewer_pods_made_than_min_workers_wait() -> None:
    job = _gpu_spec(elastic={"minWorkers": 3, "waitSeconds": 60})
    plan = _reconcile(job, MixedPrecisionJobStatus(), {}, 0)
    waiting = _reconcile(job, plan.status, _made(2, REFUSED), 70)
    assert not waiting.delete and len(waiting.status.attempts) == 1
    (awaiting,) = [c for c in waiting.status.conditions if c.type == "AwaitingWorkers"]
    assert awaiting.status == "True" and "the namespace's ResourceQuota holds 2 of 3" in awaiting.message


def quota(hard: dict[str, str], used: dict[str, str], **quota_spec: Any) -> dict[str, Any]:
    return {"spec": {"hard": hard, **quota_spec}, "status": {"hard": hard, "used": used}}


GPUS = {"requests.nvidia.com/gpu": "2"}
# (id, spec.resources, quotas, workers running, workers the quotas hold)
TABLE: list[tuple[str, dict[str, Any], list[dict[str, Any]], int, int | None]] = [
    ("no-quota", {}, [], 2, None),
    ("gpus-all-its-own", {}, [quota(GPUS, GPUS)], 2, 2),
    ("gpus-raised", {}, [quota({"requests.nvidia.com/gpu": "3"}, GPUS)], 2, 3),
    ("others-use-some", {}, [quota({"requests.nvidia.com/gpu": "4"}, {"requests.nvidia.com/gpu": "3"})], 1, 2),
    ("over-used-after-a-cut", {}, [quota({"requests.nvidia.com/gpu": "1"}, GPUS)], 2, 1),
    ("pods-count", {}, [quota({"pods": "5"}, {"pods": "4"})], 2, 3),
    ("least-of-two", {}, [quota({"pods": "9"}, {"pods": "2"}), quota(GPUS, GPUS)], 2, 2),
    (
        "cpu-requests-in-millicores",
        {"requests": {"cpu": "1500m"}},
        [quota({"requests.cpu": "6", "limits.memory": "1Gi"}, {"requests.cpu": "4500m"})],
        2,
        3,
    ),
    ("bare-memory-means-requests", {"limits": {"memory": "4Gi"}}, [quota({"memory": "10Gi"}, {"memory": "8Gi"})], 2, 2),
    ("scoped-quota-not-read", {}, [quota(GPUS, GPUS, scopes=["BestEffort"])], 2, None),
    ("resource-not-asked", {}, [quota({"services": "1"}, {"services": "1"})], 2, None),
    ("unreadable-quantity-skipped", {}, [quota({"requests.nvidia.com/gpu": "lots"}, GPUS)], 2, None),
]


@pytest.mark.parametrize(("resources", "quotas", "running", "held"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_the_workers_a_namespace_quota_holds(
    resources: dict[str, Any], quotas: list[dict[str, Any]], running: int, held: int | None
) -> None:
    job = _gpu_spec(resources={"gpusPerWorker": 1, **resources})
    assert quota_workers(job, quotas, running=running) == held


def test_a_worker_asks_a_gpu_request_its_limit_says() -> None:
    demand = worker_demand(_gpu_spec(resources={"gpusPerWorker": 2, "requests": {"cpu": "2"}}))
    assert demand["requests.nvidia.com/gpu"] == demand["limits.nvidia.com/gpu"] == Decimal(2)
    assert demand["requests.cpu"] == demand["cpu"] == Decimal(2) and "limits.cpu" not in demand
    assert demand["pods"] == demand["count/pods"] == Decimal(1)
