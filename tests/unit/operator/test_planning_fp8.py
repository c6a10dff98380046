"""The fp8 rung of the ladder in the planner: fp8 -> bf16 -> fp32, re-promotion back to fp8,
and fp8 never a fallback below a safer precision."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.planner import StartAttempt, after_attempt, first_attempt, ladder, promotion_target
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec
from mpjob_contract.launch import CHECKPOINT_MOUNT

pytestmark = pytest.mark.unit


def spec(**precision: object) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "precision": precision})


def test_an_fp8_job_starts_in_fp8_and_falls_back_to_bf16_from_the_last_good_checkpoint() -> None:
    s = spec(mode="fp8")
    assert ladder(s) == ["fp8", "bf16", "fp32"] and first_attempt(s).precision == "fp8"
    nxt = after_attempt(s, 0, "fp8", classify(AttemptOutcome(42)), 20, f"{CHECKPOINT_MOUNT}/step-20")
    assert isinstance(nxt, StartAttempt)
    assert (nxt.precision, nxt.fallback_from, nxt.resume_from) == ("bf16", "fp8", f"{CHECKPOINT_MOUNT}/step-20")
    assert (nxt.micro_batch, nxt.grad_accumulation) == (16, 1)  # bf16 activations are as wide as fp8's


def test_bf16_after_fp8_repromotes_back_to_fp8() -> None:
    s = spec(mode="fp8", repromoteAfterSteps=10)
    history = [AttemptStatus(index=0, precision="fp8", reason="NumericFault")]
    down = after_attempt(s, 0, "fp8", classify(AttemptOutcome(42)), 20, None, history=history)
    assert isinstance(down, StartAttempt) and (down.precision, down.repromote_after_steps) == ("bf16", 10)
    assert promotion_target(s, "bf16", history) == "fp8"
    up = after_attempt(s, 1, "bf16", classify(AttemptOutcome(47)), 30, f"{CHECKPOINT_MOUNT}/step-30", history=history)
    assert isinstance(up, StartAttempt) and (up.precision, up.promoted_from, up.start_step) == ("fp8", "bf16", 30)


@pytest.mark.parametrize(
    ("mode", "fallback"), [("fp16", ["fp8"]), ("bf16", ["fp8", "fp32"]), ("fp8", ["fp8", "bf16"]), ("auto", ["fp8"])]
)
def test_fp8_in_the_fallback_list_is_refused_not_dropped(mode: str, fallback: list[str]) -> None:
    with pytest.raises(ValidationError) as caught:
        spec(mode=mode, fallback=fallback)
    assert [e["loc"] for e in caught.value.errors()] == [("precision", "fallback")]
    assert ladder(spec(mode="fp8", fallback=["bf16"])) == ["fp8", "bf16"]


def test_an_auto_attempt_that_measured_fp8_falls_back_to_the_spec_ladder() -> None:
    s = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 1, "minComputeCapability": "9.0"}}
    )
    nxt = after_attempt(s, 0, "fp8", classify(AttemptOutcome(42)), 10, None)  # auto measured fp8 on the node
    assert isinstance(nxt, StartAttempt) and (nxt.precision, nxt.fallback_from) == ("bf16", "fp8")
