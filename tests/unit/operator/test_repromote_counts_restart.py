"""A fallback attempt restarted in its own precision (its node lost, an infrastructure error, a
smaller micro-batch) before it wrote a checkpoint of its own resumes from the checkpoint the
faulted precision wrote before the fault, which records nothing of it: its launch still says the
step the precision faulted at (repromoteCountsFrom), or it would go back up at its first
checkpoint, into the steps that faulted, as a fallback counting from its start did."""

from __future__ import annotations

import pytest

from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.planner import StartAttempt, after_attempt
from mpjob_contract.api import AttemptStatus
from mpjob_contract.launch import CHECKPOINT_MOUNT
from tests.unit.operator.test_planning import spec

pytestmark = pytest.mark.unit

JOB = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 50})
FAULTED = AttemptStatus(index=0, precision="fp16", reason="NumericFault", start_step=0, end_step=37)


@pytest.mark.parametrize("code", [1, 46])  # an infrastructure failure; out of device memory (a smaller split)
def test_a_fallback_restarted_in_its_precision_still_counts_from_the_fault(code: int) -> None:
    lost = AttemptStatus(index=1, precision="bf16", reason="InfraError", start_step=20, end_step=30)
    again = after_attempt(JOB, 1, "bf16", classify(AttemptOutcome(code)), 20, None, history=[FAULTED, lost])
    assert isinstance(again, StartAttempt) and again.precision == "bf16" and again.repromote_after_steps == 50
    assert again.repromote_counts_from == 37
    # restarted twice: still the fault of the precision it fell back from
    twice = AttemptStatus(index=2, precision="bf16", reason="InfraError", start_step=20, end_step=25)
    third = after_attempt(JOB, 2, "bf16", classify(AttemptOutcome(1)), 20, None, history=[FAULTED, lost, twice])
    assert isinstance(third, StartAttempt) and third.repromote_counts_from == 37


def test_a_restart_after_a_repromotion_or_of_the_first_precision_counts_from_its_checkpoint() -> None:
    first = after_attempt(JOB, 0, "fp16", classify(AttemptOutcome(1)), 20, None, history=[FAULTED.model_copy(
        update={"reason": "InfraError"})])  # fmt: skip
    assert isinstance(first, StartAttempt) and first.repromote_counts_from is None
    down = AttemptStatus(index=1, precision="bf16", reason="Repromote", start_step=20, end_step=100)
    up = AttemptStatus(index=2, precision="fp16", reason="InfraError", start_step=100, end_step=120, repromoted=True)
    again = after_attempt(JOB, 2, "fp16", classify(AttemptOutcome(1)), 100, f"{CHECKPOINT_MOUNT}/step-100",
                          history=[FAULTED, down, up])  # fmt: skip
    assert isinstance(again, StartAttempt) and again.repromote_counts_from is None
