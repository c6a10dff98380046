"""The rule that ends a job whose last two attempts failed the same way at the same step
(mpjob.planning.repeat), alone and through the planner."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.planner import Finish, StartAttempt, after_attempt
from mpjob.planning.repeat import AT_THE_SAME_STEP, BEFORE_FIRST_STEP, repeated_failure
from mpjob_contract.api import AttemptStatus
from mpjob_contract.codes import FinishReason
from mpjob_contract.report import TerminationReport
from tests.unit.operator.test_planning import spec

pytestmark = pytest.mark.unit

CANNOT_OPEN = (
    "local rank 0 (rank 0) exited 2 without a termination report; its stderr ended:\n"
    "python: can't open file '/work/train.py': [Errno 2] No such file or directory"
)


def attempt(
    index: int,
    *,
    reason: str = "InfraError",
    code: int | None = 1,
    message: str = CANNOT_OPEN,
    start: int = 0,
    end: int | None = 0,
) -> AttemptStatus:
    return AttemptStatus(
        index=index, precision="bf16", start_step=start, end_step=end, reason=reason, exit_code=code, message=message
    )


KEY_ERROR = "KeyError: 'labels'"


@dataclass(frozen=True)
class Case:
    history: list[AttemptStatus]
    ends: FinishReason | None


CASES = {
    "twice the same before the first step": Case([attempt(0), attempt(1)], BEFORE_FIRST_STEP),
    "a resumed attempt that ended where it began": Case(
        [attempt(3, start=100, end=100), attempt(4, start=100, end=100)], BEFORE_FIRST_STEP
    ),
    "only once": Case([attempt(0)], None),
    "the same exception at the same step, trained up to it twice": Case(
        [attempt(0, end=40, message=KEY_ERROR), attempt(1, start=20, end=40, message=KEY_ERROR)], AT_THE_SAME_STEP
    ),
    # A checkpoint at 40, and the step after it raises again: the same step, whatever was trained.
    "the one before trained, the last resumed at the step and failed there": Case(
        [attempt(0, end=40), attempt(1, start=40, end=40)], AT_THE_SAME_STEP
    ),
    "the same exception at different steps": Case(
        [attempt(0, end=40, message=KEY_ERROR), attempt(1, start=20, end=41, message=KEY_ERROR)], None
    ),
    "the last trained": Case([attempt(0), attempt(1, end=10)], None),
    "different messages": Case([attempt(0), attempt(1, message="ModuleNotFoundError: No module named 'x'")], None),
    "different exit codes": Case([attempt(0, code=2), attempt(1, code=1)], None),
    # A report made for a rank that left none has step 0: after a resume that is not "no step".
    "a resumed attempt whose progress is unknown": Case(
        [attempt(0, start=100, end=0), attempt(1, start=100, end=0)], None
    ),
    "no report at all (no end step)": Case([attempt(0, end=None), attempt(1, end=None)], None),
    "the platform stopped it": Case(
        [attempt(0, reason="PodDeleted", code=137), attempt(1, reason="PodDeleted", code=137)], None
    ),
    "preempted twice": Case([attempt(0, reason="Preempted", code=44), attempt(1, reason="Preempted", code=44)], None),
    "not in a row": Case([attempt(0), attempt(1, reason="Preempted", code=44, end=0), attempt(2)], None),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_two_attempts_in_a_row_that_fail_the_same_way_at_the_same_step_end_the_job(case: Case) -> None:
    said = repeated_failure(case.history)
    assert (said and said[0]) == case.ends
    if said is not None:
        last = case.history[-1]
        assert said[1].endswith(last.message or "")
        where = "before their first step" if case.ends is BEFORE_FIRST_STEP else f"at step {last.end_step}"
        assert f"failed the same way {where}" in said[1]


def test_the_planner_fails_the_job_on_the_second_such_attempt_instead_of_spending_every_attempt() -> None:
    s = spec(runPolicy={"maxAttempts": 6})
    report = TerminationReport(reason="InfraError", message=CANNOT_OPEN)
    result = classify(AttemptOutcome(1, report))
    first = after_attempt(s, 0, "bf16", result, 0, None, history=[attempt(0)])
    assert isinstance(first, StartAttempt) and first.index == 1  # once could be the machine: retried
    done = after_attempt(s, 1, "bf16", result, 0, None, history=[attempt(0), attempt(1)])
    assert isinstance(done, Finish) and not done.succeeded and done.reason == BEFORE_FIRST_STEP
    assert "python: can't open file '/work/train.py'" in done.message


def test_a_script_that_raises_at_the_same_step_again_fails_the_job_instead_of_spending_every_attempt() -> None:
    s = spec(runPolicy={"maxAttempts": 6})
    report = TerminationReport(reason="InfraError", step=40, message=KEY_ERROR)
    result = classify(AttemptOutcome(1, report))
    first = attempt(0, end=40, message=KEY_ERROR)
    again = after_attempt(s, 0, "bf16", result, 20, None, history=[first])
    assert isinstance(again, StartAttempt) and again.index == 1  # once could be the machine: retried
    done = after_attempt(
        s, 1, "bf16", result, 20, None, history=[first, attempt(1, start=20, end=40, message=KEY_ERROR)]
    )
    assert isinstance(done, Finish) and not done.succeeded and done.reason == AT_THE_SAME_STEP
    assert done.message.endswith(KEY_ERROR) and "at step 40" in done.message
