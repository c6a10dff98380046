"""The operator's cost counters add what a status write changed, once."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from mpjob.controller import costs
from mpjob.controller.config import OperatorConfig
from mpjob.controller.workqueue import Retry
from mpjob.planning import cost
from mpjob_contract.accounting import CostPerGpuHour
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_api_errors import FakeCluster, api_error, events, reconciler  # noqa: F401 (a fixture)
from tests.unit.operator.test_cache import job, pod

KEY = ("ns", "j")

pytestmark = pytest.mark.unit


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_write_is_counted_once_with_its_price() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "training": {"batchSize": 4}})
    ended = AttemptStatus(
        index=0, precision="fp16", end_step=30, reason="NumericFault", finish_time="2026-11-22T12:00:00Z"
    )
    before = MixedPrecisionJobStatus(attempts=[ended])
    after = before.model_copy(deep=True)
    after.attempts.append(AttemptStatus(index=1, precision="bf16", start_step=20))
    cost.settle(after, spec, {0: 360.0})
    price = CostPerGpuHour(amount=10.0, currency="CHF")
    used = sample("mpjob_operator_gpu_seconds_total", outcome="NumericFault")
    wasted = sample("mpjob_operator_wasted_gpu_seconds_total", reason="rollback")
    spent = sample("mpjob_operator_gpu_cost_total", currency="CHF", outcome="NumericFault")
    costs.count(before, after, price)
    costs.count(after, after, price)  # the next reconcile (or a restarted operator) reads it back
    assert sample("mpjob_operator_gpu_seconds_total", outcome="NumericFault") - used == 360.0
    assert sample("mpjob_operator_wasted_gpu_seconds_total", reason="rollback") - wasted == 120.0
    assert sample("mpjob_operator_gpu_cost_total", currency="CHF", outcome="NumericFault") - spent == 1.0
    assert sample("mpjob_operator_wasted_gpu_cost_total", currency="CHF", reason="rollback") > 0


def gpu_seconds_counted() -> float:
    """mpjob_operator_gpu_seconds_total, over every outcome."""
    counted = (s for m in REGISTRY.collect() if m.name == "mpjob_operator_gpu_seconds" for s in m.samples)
    return sum(s.value for s in counted if s.name.endswith("_total"))


def test_an_ending_written_before_its_next_attempt_fails_to_start_is_counted_once(events: list) -> None:  # noqa: F811
    """The reconcile that writes an attempt's ending (its GPU-seconds) and then cannot make the
    next attempt's Job (a 503): the write held, so its GPU-seconds are counted then; the retry
    reads them back from the status and counts nothing more."""
    cluster = FakeCluster()
    cluster.body["spec"]["resources"] = {"gpusPerWorker": 2}
    made = reconciler(cluster, OperatorConfig(retry_seconds=1.0, retry_max_seconds=8.0, attempt_backoff_seconds=0))
    made.handle(KEY, False)  # attempt 0's Job made (uid job-uid)
    failed = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}
    made.cache.apply("jobs", "ADDED", job(0, uid="job-uid", conditions=[failed]))
    crashed = pod(0, "Failed", exitCode=1, startedAt="2026-12-01T11:00:00Z", finishedAt="2026-12-01T11:01:40Z")
    crashed["metadata"]["ownerReferences"][0]["uid"] = "job-uid"
    made.cache.apply("pods", "ADDED", crashed)
    before, cluster.create_error = gpu_seconds_counted(), api_error(503, "etcd leader changed")
    with pytest.raises(Retry):
        made.handle(KEY, False)  # attempt 0's end written, attempt 1's Job refused for now
    assert cluster.body["status"]["attempts"][0]["gpuSeconds"] == 200.0  # 100 s x 2 GPUs
    cluster.create_error = None
    made.handle(KEY, False)  # the retry makes attempt 1's Job
    made.handle(KEY, True)
    assert gpu_seconds_counted() - before == 200.0
