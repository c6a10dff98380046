"""A change of precision in place may take another split of the global batch
(precision.fallbackKeepsBatch): the fallback fp16 16 x 1 -> fp32 8 x 2 and its re-promotion back to
fp16 16 x 1 both go on in place, in the planner's split (the target's microBatch x gradAccumulation,
the same samples per step), unless the model is sharded; the launch refuses a target whose split is
half said or does not keep the global batch, and the operator records each attempt in the split the
trainer says it took."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from mpjob.planning import lifecycle as lc
from mpjob.planning.changed import record
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.inplace import in_place_plan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.planner import StartAttempt, after_attempt, first_attempt
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_contract.report import InPlaceChange

pytestmark = pytest.mark.unit
NOW = "2026-12-02T12:00:00Z"


def spec(**over: Any) -> MixedPrecisionJobSpec:
    doc: dict[str, Any] = {
        "task": {"builtin": "mlp"},
        "training": {"batchSize": 16, "gradAccumulation": 1},
        "precision": {"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 5},
        "runPolicy": {"maxAttempts": 10},
        **over,
    }
    return MixedPrecisionJobSpec.model_validate(doc)


def targets(job: MixedPrecisionJobSpec) -> list[InPlaceTarget]:
    return in_place_plan(job, first_attempt(job), MixedPrecisionJobStatus()).to


def test_a_fallback_that_splits_the_micro_batch_goes_in_place_in_that_split() -> None:
    (fp32,) = targets(spec())
    assert (fp32.precision, fp32.shape, fp32.repromote_after_steps) == ("fp32", (8, 2), 5)
    # Its re-promotion takes the full micro-batch back, in place too.
    assert fp32.promote_to is not None and (fp32.promote_to.precision, fp32.promote_to.shape) == ("fp16", (16, 1))


def test_only_the_fallback_that_splits_names_a_split() -> None:
    ladder = targets(spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"]}))
    assert [(t.precision, t.shape) for t in ladder] == [("bf16", None), ("fp32", (8, 2))]
    (kept,) = targets(spec(precision={"mode": "fp16", "fallback": ["fp32"], "fallbackKeepsBatch": False}))
    assert (kept.precision, kept.shape) == ("fp32", None)


def test_a_sharded_models_fallback_into_another_split_goes_on_in_place() -> None:
    """FSDP2's model is wrapped anew in the next precision, its loop re-entering in the split."""
    (fp32,) = targets(spec(parallelism={"strategy": "fsdp"}, workers=2))
    assert (fp32.precision, fp32.shape) == ("fp32", (8, 2))
    ladder = targets(spec(parallelism={"strategy": "fsdp"}, workers=2,
                          precision={"mode": "fp16", "fallback": ["bf16", "fp32"]}))  # fmt: skip
    assert [(t.precision, t.shape) for t in ladder] == [("bf16", None), ("fp32", (8, 2))]


def test_a_repromoted_attempts_own_fallback_splits_again_in_place() -> None:
    (fp32,) = targets(spec())
    assert fp32.promote_to is not None
    (again,) = fp32.promote_to.in_place_to
    assert (again.precision, again.shape, again.promote_to) == ("fp32", (8, 2), None)  # fp16 faulted twice: barred


def test_an_out_of_memory_splits_fallback_splits_further() -> None:
    job = spec()
    first = in_place_plan(job, first_attempt(job), MixedPrecisionJobStatus()).splits[0]
    assert (first.micro_batch, first.grad_accumulation) == (8, 2)
    assert [(t.precision, t.shape) for t in first.in_place_to] == [("fp32", (4, 4))]


def launch_doc(job: MixedPrecisionJobSpec) -> dict[str, Any]:
    start = first_attempt(job)
    launch = attempt_launch(job, start, in_place_plan(job, start, MixedPrecisionJobStatus()), job_name="j",
                            namespace="n", checkpoint_dir="/checkpoints/n/j", resume_from=None)  # fmt: skip
    said = AttemptLaunch.model_validate_json(launch.to_env())  # the launch carries the split
    assert said.in_place_to[0].shape == (8, 2)
    return launch.model_dump(by_alias=True)


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        ({"microBatch": 8}, "set both or neither"),
        ({"microBatch": 8, "gradAccumulation": 4}, "must equal the spec's"),
        ({"microBatch": 8, "gradAccumulation": 0}, "gradAccumulation"),
    ],
)
def test_a_launch_refuses_a_fallback_split_that_is_half_said_or_changes_the_global_batch(
    shape: dict, said: str
) -> None:
    doc = launch_doc(spec())
    doc["inPlaceTo"] = [{"precision": "fp32", **shape}]
    with pytest.raises(ValidationError, match=said):
        AttemptLaunch.model_validate(doc)


def test_a_fallback_made_in_place_is_recorded_in_the_split_the_trainer_took() -> None:
    job = spec()
    plan = lc.Plan(MixedPrecisionJobStatus())
    lc.begin(plan, job, first_attempt(job), lc.When(NOW, 1))
    plan = lc.Plan(plan.status)
    made = InPlaceChange.model_validate(
        {"kind": "fallback", "attempt": 1, "step": 12, "startStep": 10, "fromPrecision": "fp16",
         "toPrecision": "fp32", "rule": "MaxConsecutiveOverflows", "message": "overflows", "recoverySeconds": 0.02,
         "microBatch": 8, "gradAccumulation": 2}
    )  # fmt: skip
    begun = record(plan, job, [made], lc.When(NOW, 1), capability=None)
    assert begun is not None and (begun.precision, begun.micro_batch, begun.grad_accumulation) == ("fp32", 8, 2)
    ended, now = plan.status.attempts
    assert (ended.precision, ended.reason, ended.micro_batch, ended.grad_accumulation) == (
        "fp16",
        "NumericFault",
        16,
        1,
    )
    assert (now.precision, now.in_place, now.start_step, now.micro_batch, now.grad_accumulation) == (
        "fp32", True, 10, 8, 2
    )  # fmt: skip
    assert not plan.create  # no Job for it


def fell_back(job: MixedPrecisionJobSpec) -> tuple[StartAttempt, MixedPrecisionJobStatus]:
    """fp16 (16 x 1) faulted at step 10: the fp32 attempt the planner starts, and the status then."""
    status = MixedPrecisionJobStatus(
        attempts=[AttemptStatus(index=0, precision="fp16", reason="NumericFault", micro_batch=16, grad_accumulation=1)]
    )
    start = after_attempt(job, 0, "fp16", classify(AttemptOutcome(42)), 10, None, history=status.attempts)
    assert isinstance(start, StartAttempt)
    return start, status


def test_a_repromotion_that_takes_back_the_full_micro_batch_goes_in_place_in_that_split() -> None:
    job = spec()
    fp32, status = fell_back(job)
    assert (fp32.precision, fp32.micro_batch, fp32.grad_accumulation) == ("fp32", 8, 2)
    up = in_place_plan(job, fp32, status).promote_to
    assert up is not None and (up.precision, up.micro_batch, up.grad_accumulation) == ("fp16", 16, 1)
    assert up.shape == (16, 1)
    # The launch carries it, and keeps the global batch for both splits.
    launch = attempt_launch(job, fp32, in_place_plan(job, fp32, status), job_name="j", namespace="n",
                            checkpoint_dir="/checkpoints/n/j", resume_from=None)  # fmt: skip
    said = AttemptLaunch.model_validate_json(launch.to_env())
    assert said.promote_in_place_to is not None and said.promote_in_place_to.shape == (16, 1)


def test_a_repromotion_in_the_same_split_names_none() -> None:
    """bf16 keeps fp16's 16 x 1: its re-promotion to fp16 goes in place with no split named."""
    job = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 5})
    (bf16, *_) = in_place_plan(job, first_attempt(job), MixedPrecisionJobStatus()).to
    assert bf16.promote_to is not None and bf16.promote_to.precision == "fp16"
    assert bf16.promote_to.shape is None and "microBatch" not in bf16.promote_to.model_dump(exclude_none=True)


def test_a_sharded_models_repromotion_takes_the_micro_batch_back_in_place() -> None:
    job = spec(parallelism={"strategy": "fsdp"}, workers=2)
    fp32, status = fell_back(job)
    assert fp32.micro_batch == 8  # the fallback split as before
    up = in_place_plan(job, fp32, status).promote_to
    assert up is not None and (up.precision, up.shape) == ("fp16", (16, 1))


def test_a_repromoted_attempts_own_fallback_into_fp32_splits_again_in_place() -> None:
    fp32, status = fell_back(spec())
    up = in_place_plan(spec(), fp32, status).promote_to
    assert up is not None
    assert [(t.precision, t.shape) for t in up.in_place_to] == [("fp32", (8, 2))]


@pytest.mark.parametrize(
    ("shape", "said"),
    [
        ({"microBatch": 16}, "set both or neither"),
        ({"gradAccumulation": 1}, "set both or neither"),
        ({"microBatch": 16, "gradAccumulation": 2}, "must equal the spec's"),
        ({"microBatch": 0, "gradAccumulation": 1}, "microBatch"),
    ],
)
def test_a_launch_refuses_a_repromotion_split_that_is_half_said_or_changes_the_global_batch(
    shape: dict, said: str
) -> None:
    fp32, status = fell_back(spec())
    launch = attempt_launch(spec(), fp32, in_place_plan(spec(), fp32, status), job_name="j", namespace="n",
                            checkpoint_dir="/checkpoints/n/j", resume_from=None)  # fmt: skip
    doc = launch.model_dump(by_alias=True)
    doc["promoteInPlaceTo"] = {"precision": "fp16", **shape}
    with pytest.raises(ValidationError, match=said):
        AttemptLaunch.model_validate(doc)
    doc["promoteInPlaceTo"] = {"precision": "fp16", "inPlaceTo": [{"precision": "fp32", **shape}]}  # at any depth
    with pytest.raises(ValidationError, match=said):
        AttemptLaunch.model_validate(doc)


def test_an_older_target_without_a_split_still_reads() -> None:
    target = InPlaceTarget.model_validate({"precision": "fp16", "repromoteAfterSteps": 5})
    assert target.shape is None


def test_a_repromotion_made_in_place_is_recorded_in_the_split_the_trainer_took() -> None:
    job = spec()
    plan = lc.Plan(MixedPrecisionJobStatus())
    lc.begin(plan, job, first_attempt(job), lc.When(NOW, 1))
    fault = lc.Plan(plan.status)
    lc.conclude(fault, job, attempt=plan.create[0], outcome=AttemptOutcome(42), when=lc.When(NOW, 1), capability=None)
    assert (fault.create[0].precision, fault.create[0].micro_batch) == ("fp32", 8)  # a restart, its Job made
    plan = lc.Plan(fault.status)
    made = InPlaceChange.model_validate(
        {"kind": "repromote", "attempt": 2, "step": 15, "startStep": 15, "fromPrecision": "fp32",
         "toPrecision": "fp16", "rule": "repromote", "message": "5 clean steps", "recoverySeconds": 0.01,
         "microBatch": 16, "gradAccumulation": 1}
    )  # fmt: skip
    begun = record(plan, job, [made], lc.When(NOW, 1), capability=None)
    assert begun is not None and (begun.precision, begun.micro_batch, begun.grad_accumulation) == ("fp16", 16, 1)
    *_, ended, now = plan.status.attempts
    assert (ended.precision, ended.reason, ended.micro_batch, ended.grad_accumulation) == ("fp32", "Repromote", 8, 2)
    assert (now.precision, now.in_place, now.repromoted, now.micro_batch, now.grad_accumulation) == (
        "fp16", True, True, 16, 1
    )  # fmt: skip
    assert not plan.create  # no Job for it
