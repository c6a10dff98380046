"""The operator's cost counters add what a status write changed, once."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from mpjob.controller import costs
from mpjob.planning import cost
from mpjob_contract.accounting import CostPerGpuHour
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus

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
