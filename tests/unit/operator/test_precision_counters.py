"""The operator's precision counters: a fallback is counted as one, a re-promotion (back up the
ladder after clean steps) as a re-promotion, never as a fallback (FallbackStorm sums fallbacks)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY

from mpjob.controller.metrics import count_plan
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT
from mpjob_contract.report import CheckpointRef, TerminationReport

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
SPEC = MixedPrecisionJobSpec.model_validate(
    {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 20}}
)


def ended(index: int, code: int, reason: Reason, precision: str, step: int) -> dict[int, JobView]:
    ref = CheckpointRef(step=step, path=f"{CHECKPOINT_MOUNT}/step-{step}", sha256="ab", precision=precision)
    said = TerminationReport(reason=reason, step=step, precision=precision, last_good_checkpoint=ref).to_message()
    pod = PodView("p", 0, "Failed", alive=False, exit_code=code, termination_message=said)
    return {index: JobView(index, finished="Failed", reason="BackoffLimitExceeded", pods=(pod,))}


FALLBACKS, REPROMOTIONS = "mpjob_operator_precision_fallbacks_total", "mpjob_operator_precision_repromotions_total"


FALL, RISE = ("fp16", "bf16"), ("bf16", "fp16")


def counted(name: str, src: str, dst: str) -> float:
    return REGISTRY.get_sample_value(name, {"from_precision": src, "to_precision": dst}) or 0.0


def counts() -> list[float]:
    """fp16 -> bf16 fallbacks, bf16 -> fp16 fallbacks, bf16 -> fp16 re-promotions."""
    return [counted(FALLBACKS, *FALL), counted(FALLBACKS, *RISE), counted(REPROMOTIONS, *RISE)]


def test_a_fallback_is_counted_as_a_fallback_and_a_repromotion_as_a_repromotion() -> None:
    before = counts()
    status = reconcile(SPEC, MixedPrecisionJobStatus(), 1, {}, NOW).status
    down = reconcile(SPEC, status, 1, ended(0, 42, Reason.NUMERIC_FAULT, "fp16", 10), NOW)
    count_plan(status, down)
    up = reconcile(SPEC, down.status, 1, ended(1, 47, Reason.REPROMOTE, "bf16", 40), NOW)
    count_plan(down.status, up)
    assert [(c.precision, c.promoted_from) for c in up.create] == [("fp16", "bf16")]
    assert [a - b for a, b in zip(counts(), before, strict=True)] == [1.0, 0.0, 1.0]
