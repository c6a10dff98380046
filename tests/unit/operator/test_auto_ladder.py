"""An `auto` job's ladder begins where its first attempt really trained: the precision its trainer
measured on the node, which the spec's minComputeCapability may not predict. Fallbacks follow it,
and a re-promotion goes back up to it, never above it to a precision the job never ran in."""

from __future__ import annotations

import pytest

from mpjob.planning import lifecycle as lc
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt, after_attempt, first_attempt, ladder, promotion_target
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason, exit_code_for
from mpjob_contract.report import TerminationReport

pytestmark = pytest.mark.unit

WHEN = When("2026-12-04T12:00:00Z")


def spec(capability: str = "7.0") -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "mlp"},
            "precision": {"mode": "auto", "repromoteAfterSteps": 5},
            "resources": {"gpusPerWorker": 1, "minComputeCapability": capability},
        }
    )


def attempt(index: int, precision: str, reason: str, repromoted: bool | None = None) -> AttemptStatus:
    return AttemptStatus(index=index, precision=precision, reason=reason, repromoted=repromoted)  # type: ignore[arg-type]


def test_a_retried_attempt_in_the_measured_precision_is_not_told_to_climb_above_it() -> None:
    s = spec()  # the capability's ladder: fp16, bf16, fp32
    assert ladder(s) == ["fp16", "bf16", "fp32"]
    history = [attempt(0, "bf16", "Preempted")]  # auto measured bf16 on the node; then it was preempted
    assert promotion_target(s, "bf16", history) is None
    nxt = after_attempt(s, 0, "bf16", classify(AttemptOutcome(44)), 10, None, history=history)
    assert isinstance(nxt, StartAttempt) and (nxt.precision, nxt.repromote_after_steps) == ("bf16", None)


def test_a_fallback_from_the_measured_precision_repromotes_back_to_it_and_no_higher() -> None:
    s = spec()
    history = [attempt(0, "bf16", "NumericFault")]
    down = after_attempt(s, 0, "bf16", classify(AttemptOutcome(42)), 10, None, history=history)
    assert isinstance(down, StartAttempt) and (down.precision, down.repromote_after_steps) == ("fp32", 5)
    history.append(attempt(1, "fp32", "Repromote"))
    up = after_attempt(s, 1, "fp32", classify(AttemptOutcome(47)), 20, None, history=history)
    assert isinstance(up, StartAttempt) and (up.precision, up.promoted_from) == ("bf16", "fp32")
    assert up.repromote_after_steps is None  # back where the job began: nothing above it
    history.append(attempt(2, "bf16", "Preempted", repromoted=True))
    again = after_attempt(s, 2, "bf16", classify(AttemptOutcome(44)), 30, None, history=history)
    assert isinstance(again, StartAttempt) and (again.precision, again.repromote_after_steps) == ("bf16", None)


def test_a_measured_precision_off_the_capability_ladder_is_the_one_a_fallback_goes_back_up_to() -> None:
    s = spec("8.0")  # the capability's ladder: bf16, fp32; the node measured fp16 fastest
    history = [attempt(0, "fp16", "NumericFault")]
    down = after_attempt(s, 0, "fp16", classify(AttemptOutcome(42)), 10, None, history=history)
    assert isinstance(down, StartAttempt) and (down.precision, down.fallback_from) == ("bf16", "fp16")
    assert down.repromote_after_steps == 5 and promotion_target(s, "bf16", history) == "fp16"
    history.append(attempt(1, "bf16", "Repromote"))
    up = after_attempt(s, 1, "bf16", classify(AttemptOutcome(47)), 20, None, history=history)
    assert isinstance(up, StartAttempt) and (up.precision, up.promoted_from) == ("fp16", "bf16")


def test_an_attempt_that_never_measured_keeps_the_capability_ladder() -> None:
    s = spec()
    history = [attempt(0, "auto", "InfraError")]  # killed before it measured: still `auto`
    nxt = after_attempt(s, 0, "auto", classify(AttemptOutcome(1)), 0, None, history=history)
    assert isinstance(nxt, StartAttempt) and (nxt.precision, nxt.repromote_after_steps) == ("auto", None)


def _lifecycle(s: MixedPrecisionJobSpec, *endings: AttemptOutcome) -> tuple[Plan, StartAttempt]:
    """The job's attempts through the operator's lifecycle, each ending as the next of `endings`:
    the plan the last left and the attempt it began."""
    plan = Plan(status=MixedPrecisionJobStatus())
    lc.begin(plan, s, first_attempt(s), WHEN)
    start = plan.create[0]
    for outcome in endings:
        plan = Plan(status=plan.status)
        lc.conclude(plan, s, attempt=start, outcome=outcome, when=WHEN)
        assert plan.create, plan.status.message
        start = plan.create[0]
    return plan, start


def ended(reason: Reason, precision: str) -> AttemptOutcome:
    report = TerminationReport(reason=reason, step=10, precision=precision)  # type: ignore[arg-type]
    return AttemptOutcome(exit_code_for(reason), report)


#: Attempt 0 crashed before it measured its node (still `auto`); attempt 1 measured bf16 there.
NEVER_MEASURED = AttemptOutcome(1)


def test_a_measured_precision_after_an_attempt_that_never_measured_is_the_top_of_the_ladder() -> None:
    s = spec()  # the capability's ladder: fp16, bf16, fp32; the node measured bf16
    _, nxt = _lifecycle(s, NEVER_MEASURED, ended(Reason.PREEMPTED, "bf16"))
    assert (nxt.precision, nxt.repromote_after_steps) == ("bf16", None)  # never up to fp16, never run


def test_a_repromotion_back_to_that_measured_precision_ends_the_fallback() -> None:
    s = spec()
    plan, nxt = _lifecycle(s, NEVER_MEASURED, ended(Reason.NUMERIC_FAULT, "bf16"), ended(Reason.REPROMOTE, "fp32"))
    assert (nxt.precision, nxt.promoted_from, nxt.repromote_after_steps) == ("bf16", "fp32", None)
    (fallback,) = [c for c in plan.status.conditions if c.type == "PrecisionFallback"]
    assert (fallback.status, fallback.reason) == ("False", "Repromoted")  # back where the job trained first
