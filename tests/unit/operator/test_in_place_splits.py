"""The planner's smaller micro-batches in place (AttemptLaunch.inPlaceSplits): after running out
of device memory an attempt goes on in its processes in the split the restart path's next attempt
would take, when the job allows a change in place, the split keeps the precision and divides the
micro-batch, attempts are left and the model is not sharded; the operator records such a change
as it records a restart after OutOfDeviceMemory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mpjob.planning import lifecycle as lc
from mpjob.planning.changed import record
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.inplace import in_place_plan, in_place_splits
from mpjob.planning.planner import StartAttempt, after_attempt, first_attempt
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.launch import InPlaceSplit, InPlaceTarget
from mpjob_contract.report import MAX_CHANGES, InPlaceChange, TerminationReport

pytestmark = pytest.mark.unit
NOW = "2026-11-29T12:00:00Z"


def spec(*, batch: int = 8, **over: object) -> MixedPrecisionJobSpec:
    precision = {"mode": "fp16", "fallback": ["bf16"], **over.pop("precision", {})}  # type: ignore[dict-item]
    doc = {"task": {"builtin": "gpt"}, "training": {"batchSize": batch}, "precision": precision, **over}
    return MixedPrecisionJobSpec.model_validate(doc)


def splits(s: MixedPrecisionJobSpec) -> list[tuple[int, int]]:
    found = in_place_splits(s, first_attempt(s), MixedPrecisionJobStatus())
    return [(split.micro_batch, split.grad_accumulation) for split in found]


def test_each_smaller_split_down_to_one_sample_is_planned_in_place() -> None:
    assert splits(spec()) == [(4, 2), (2, 4), (1, 8)]
    assert splits(spec(batch=12)) == [(6, 2), (3, 4), (1, 12)]  # the smallest prime factor each time


def test_the_split_attempts_carry_their_repromotion_as_a_restarts_would() -> None:
    s = spec(precision={"repromoteAfterSteps": 20})
    plan = in_place_plan(s, first_attempt(s), MixedPrecisionJobStatus())
    first = plan.splits[0]  # fp16 is on top: nothing to go back up to
    shape = (first.micro_batch, first.grad_accumulation, first.repromote_after_steps, first.promote_to)
    assert shape == (4, 2, None, None)
    # A numeric fault of the split attempt falls back in place too, in the same split, with the
    # re-promotion a restarted bf16 attempt would get.
    assert [(t.precision, t.repromote_after_steps) for t in first.in_place_to] == [("bf16", 20)]


@pytest.mark.parametrize(
    ("why", "job"),
    [
        ("precision.inPlace false", spec(precision={"inPlace": False})),
        ("a micro-batch of one sample", spec(batch=1)),
        ("no attempt left", spec(runPolicy={"maxAttempts": 1})),
        ("a sharded model", spec(parallelism={"strategy": "fsdp"}, workers=2)),
        ("the faultPolicy retries", spec(faultPolicy={"rules": [{"fault": "OutOfDeviceMemory", "action": "Retry"}]})),
        ("an elastic job", spec(workers=2, elastic={"minWorkers": 1})),
    ],
)
def test_no_split_is_planned_in_place_when(why: str, job: MixedPrecisionJobSpec) -> None:
    assert splits(job) == [], why


def test_the_attempt_budget_bounds_the_splits() -> None:
    assert splits(spec(runPolicy={"maxAttempts": 3})) == [(4, 2), (2, 4)]


def deepest(targets: list[InPlaceTarget], splits: list[InPlaceSplit], promote: InPlaceTarget | None) -> int:
    """The most changes in place one process may make, following the plan as the trainer does."""
    ways = [1 + deepest(targets[1:], [], targets[0].promote_to)] if targets else []
    ways += [1 + deepest(list(splits[0].in_place_to), splits[1:], splits[0].promote_to)] if splits else []
    ways += [1 + deepest(list(promote.in_place_to), [], promote.promote_to)] if promote is not None else []
    return max(ways, default=0)


@pytest.mark.parametrize(("batch", "attempts"), [(256, 20), (16, 12)])
def test_no_process_is_planned_more_changes_than_its_report_lists(batch: int, attempts: int) -> None:
    """Splits, then fallbacks and re-promotions, within a large attempt budget: a process that made
    more changes than a termination report holds could write none (the report is refused), and
    its ending read as a crash with no report, retried in the precision it began in."""
    s = spec(batch=batch, precision={"fallback": ["bf16", "fp32"], "repromoteAfterSteps": 5},
             runPolicy={"maxAttempts": attempts})  # fmt: skip
    plan = in_place_plan(s, first_attempt(s), MixedPrecisionJobStatus())
    assert deepest(plan.to, plan.splits, plan.promote_to) == MAX_CHANGES  # planned up to what it holds
    change = {"kind": "microBatch", "step": 1, "startStep": 1, "fromPrecision": "fp16", "toPrecision": "fp16",
              "rule": "OutOfDeviceMemory", "recoverySeconds": 0.1}  # fmt: skip
    made = [InPlaceChange.model_validate({**change, "attempt": i}) for i in range(1, MAX_CHANGES + 1)]
    assert TerminationReport(reason="Succeeded", step=2, precision="fp16", precision_changes=made).to_message()


def test_a_split_made_in_place_is_recorded_as_a_restart_after_out_of_memory() -> None:
    s = spec()
    plan = lc.Plan(MixedPrecisionJobStatus())
    lc.begin(plan, s, first_attempt(s), lc.When(NOW, 1))
    plan.create.clear()  # its Job is created
    made = InPlaceChange.model_validate(
        {"kind": "microBatch", "attempt": 1, "step": 15, "startStep": 10, "fromPrecision": "fp16",
         "toPrecision": "fp16", "rule": "OutOfDeviceMemory", "message": "out of GPU memory: CUDA out of memory",
         "recoverySeconds": 0.1, "microBatch": 4, "gradAccumulation": 2}
    )  # fmt: skip
    begun = record(plan, s, [made], lc.When(NOW, 1))
    assert begun is not None and (begun.micro_batch, begun.grad_accumulation, begun.start_step) == (4, 2, 10)
    ended, now = plan.status.attempts
    assert (ended.reason, ended.exit_code, ended.end_step, ended.micro_batch) == ("OutOfDeviceMemory", 46, 15, 8)
    assert (now.precision, now.in_place, now.micro_batch, now.grad_accumulation) == ("fp16", True, 4, 2)
    assert not plan.create  # no Job or process for it
    assert record(plan, s, [made], lc.When(NOW, 1)) is None  # read again: recorded once


def test_a_split_of_a_repromoted_attempt_does_not_repromote_into_the_precision_that_faults_again() -> None:
    """fp16 faulted, bf16 went back up, and the re-promoted fp16 attempt runs out of memory: its
    split runs in fp16 and, if it faults, falls back to bf16 for good, as the restart path decides
    (the re-promoted fp16 attempt's entry says it was re-promoted; a re-promoted precision that
    faults again is barred)."""
    s = spec(precision={"repromoteAfterSteps": 20})
    status = MixedPrecisionJobStatus.model_validate(
        {"attempts": [
            {"index": 0, "precision": "fp16", "startStep": 0, "reason": "NumericFault", "finishTime": NOW},
            {"index": 1, "precision": "bf16", "startStep": 10, "reason": "Repromote", "finishTime": NOW},
        ]}
    )  # fmt: skip
    repromoted = replace(first_attempt(s), index=2, start_step=30, promoted_from="bf16")
    (first, *_) = in_place_splits(s, repromoted, status)
    (fallback,) = first.in_place_to
    assert (fallback.precision, fallback.repromote_after_steps, fallback.promote_to) == ("bf16", None, None)


def test_a_split_fallback_attempts_repromotion_goes_up_in_place_keeping_the_split() -> None:
    """A bf16 fallback attempt that runs out of device memory goes on in place at 4 x 2; its
    re-promotion to fp16 keeps that split (the job ran out of memory at 8) and so stays in place."""
    s = spec(precision={"repromoteAfterSteps": 20})
    status = MixedPrecisionJobStatus(
        attempts=[AttemptStatus(index=0, precision="fp16", reason="NumericFault", micro_batch=8, grad_accumulation=1)]
    )
    fault = classify(AttemptOutcome(42))
    start = after_attempt(s, 0, "fp16", fault, 10, None, history=status.attempts)
    assert isinstance(start, StartAttempt) and (start.precision, start.repromote_after_steps) == ("bf16", 20)
    first = in_place_splits(s, start, status)[0]
    assert (first.micro_batch, first.grad_accumulation) == (4, 2)
    assert first.promote_to is not None and first.promote_to.precision == "fp16"
