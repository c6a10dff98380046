"""An `auto` attempt's changes in place: its launch names, for each precision it may measure on
its node, what an attempt launched in that precision may change in place (the planner's walk
follows what it measured), its trainer takes the plan for what it measured, and the operator
records a change from it whether or not a read recorded the measurement first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from prometheus_client import generate_latest
from pydantic import ValidationError

from mpjob.controller.exposition import parse
from mpjob.controller.progress import measured as read_measurement
from mpjob.controller.progress import reading_of
from mpjob.planning.inplace import in_place_plan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.observe import Reading, observe
from mpjob.planning.planner import first_attempt
from mpjob.planning.reconcile import reconcile
from mpjob.planning.reported import measured
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import Measurement, TerminationReport
from mpjob_trainer.metrics import TrainerMetrics
from tests.unit.operator.test_in_place_records import EARLIER, NOW, change, running, started

pytestmark = pytest.mark.unit


def spec(**over: object) -> MixedPrecisionJobSpec:
    doc = {"task": {"builtin": "gpt"}, "training": {"batchSize": 8}, "precision": {"mode": "auto"}, **over}
    return MixedPrecisionJobSpec.model_validate(doc)


def launch_of(s: MixedPrecisionJobSpec) -> AttemptLaunch:
    start = first_attempt(s)
    plan = in_place_plan(s, start, MixedPrecisionJobStatus())
    return attempt_launch(s, start, plan, job_name="j", namespace="ns", checkpoint_dir="/ckpt", resume_from=None)


def test_an_auto_attempt_is_launched_with_the_changes_of_each_precision_it_may_measure() -> None:
    launch = launch_of(spec())
    assert launch.precision == "auto" and launch.in_place_to == [] and launch.in_place_splits == []
    ladders = {p: [t.precision for t in c.in_place_to] for p, c in launch.in_place_measured.items()}
    assert ladders == {"fp8": ["bf16", "fp32"], "fp16": ["bf16", "fp32"], "bf16": ["fp32"], "fp32": []}
    # Running out of memory splits 8 x 1 into 4 x 2 in place in each, the fallbacks of that attempt with it.
    fp16 = launch.in_place_measured["fp16"]
    assert [(s.micro_batch, s.grad_accumulation) for s in fp16.in_place_splits][:1] == [(4, 2)]
    assert [t.precision for t in fp16.in_place_splits[0].in_place_to] == ["bf16", "fp32"]
    assert launch.in_place_measured["fp32"].in_place_splits[0].micro_batch == 4


def test_the_trainer_takes_the_plan_for_what_it_measured_and_nothing_for_what_it_was_not_given() -> None:
    launch = launch_of(spec(precision={"mode": "auto", "fallback": ["fp32"]}))
    assert [t.precision for t in launch.changes_in("fp16").in_place_to] == ["fp32"]
    assert launch.changes_in("fp32").in_place_to == []
    read = AttemptLaunch.model_validate_json(launch.to_env())  # as the trainer reads it
    assert read.changes_in("bf16") == launch.changes_in("bf16")
    unplanned = read.model_copy(update={"in_place_measured": {}})
    assert unplanned.changes_in("bf16").in_place_to == [] and unplanned.changes_in("bf16").in_place_splits == []


@pytest.mark.parametrize(
    "over",
    [{"precision": {"mode": "auto", "inPlace": False}}, {"elastic": {"minWorkers": 1}, "workers": 2}],
    ids=["inPlace-false", "elastic"],
)
def test_no_plan_where_no_attempt_changes_in_place(over: dict) -> None:
    launch = launch_of(spec(**over))
    assert launch.in_place_measured == {}
    assert launch.changes_in("bf16").in_place_to == []


def test_a_launch_whose_measured_split_breaks_the_global_batch_is_refused() -> None:
    doc = launch_of(spec()).model_dump(by_alias=True)
    doc["inPlaceMeasured"]["bf16"]["inPlaceSplits"][0]["microBatch"] = 3
    with pytest.raises(ValidationError, match="every attempt keeps the global batch"):
        AttemptLaunch.model_validate(doc)


def test_a_change_from_an_auto_attempt_no_read_measured_records_what_it_measured() -> None:
    s = spec(resources={"gpusPerWorker": 1})
    status = started(s)
    assert status.attempts[0].precision == "auto"
    plan = reconcile(s, status, 1, {0: running()}, NOW, changes=[change(source="bf16", to="fp32")])
    first, second = plan.status.attempts
    assert (first.precision, first.reason, first.end_step) == ("bf16", "NumericFault", 50)
    assert (second.precision, second.in_place, second.start_step) == ("fp32", True, 40)
    assert plan.fallbacks == [("bf16", "fp32")] and plan.create == [] and plan.delete == []


def test_a_change_from_another_precision_than_the_one_measured_is_not_this_attempts() -> None:
    s = spec()
    status = started(s)
    measured(status, status.attempts[0], "fp16", {"fp16": 0.1, "bf16": 0.2, "fp32": 0.3})
    plan = reconcile(s, status, 1, {0: running()}, NOW, changes=[change(source="bf16", to="fp32")])
    assert [a.index for a in plan.status.attempts] == [0] and plan.status.attempts[0].precision == "fp16"
    again = reconcile(s, status, 1, {0: running()}, NOW + timedelta(seconds=1), changes=[change(to="bf16")])
    assert [(a.precision, a.in_place) for a in again.status.attempts] == [("fp16", None), ("bf16", True)]


def test_only_an_auto_attempts_launch_names_plans_by_measurement() -> None:
    """A trainer image of the release before reads every launch but an `auto` one's with changes in place."""
    fixed = launch_of(spec(precision={"mode": "fp16"}))
    assert "inPlaceMeasured" not in fixed.to_env() and fixed.in_place_to  # its own plan, as before
    assert AttemptLaunch.model_validate_json(fixed.to_env()) == fixed
    assert "inPlaceMeasured" in launch_of(spec()).to_env()


SECONDS = {"fp16": 0.1, "bf16": 0.2, "fp32": 0.3}


def test_a_measurement_read_after_a_change_in_place_is_the_measuring_attempts() -> None:
    """The trainer names its measurement for as long as its processes run: a read after the
    change gives it to the attempt that measured, once, and leaves the attempt begun in place
    its own precision."""
    s = spec()
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change(source="fp16", to="bf16")])
    read = Reading(attempt=1, measured_precision="fp16", measured_step_seconds=SECONDS)
    seen = observe(plan.status, read).status
    first, second = seen.attempts
    assert (first.precision, first.measured_step_seconds) == ("fp16", SECONDS)
    assert (second.precision, second.measured_step_seconds, seen.precision) == ("bf16", None, "bf16")
    other = Reading(attempt=1, measured_precision="fp32", measured_step_seconds={"fp32": 0.5})
    assert observe(seen, other).status == seen


def test_a_report_at_the_end_of_a_chain_gives_the_measurement_to_the_attempt_that_measured() -> None:
    s = spec()
    report = TerminationReport(
        reason=Reason.SUCCEEDED, step=100, start_step=40, precision="bf16", precision_changes=[change(at=EARLIER)],
        measurement=Measurement(step_seconds=SECONDS, chosen="fp16"),
    ).to_message()  # fmt: skip
    plan = reconcile(s, started(s), 1, {0: running(ended="Complete", report=report)}, NOW)
    assert [(a.precision, a.measured_step_seconds) for a in plan.status.attempts] == [
        ("fp16", SECONDS),
        ("bf16", None),
    ]
    assert plan.status.phase == "Succeeded" and plan.status.precision == "bf16"


def served_after_a_change() -> str:
    """What rank 0's endpoint serves once an `auto` attempt measured bf16 (bf16 faster) and then
    fell back in place to fp32: the attempt's series move to fp32, its measurement stays."""
    metrics = TrainerMetrics("j", "ns", 0, "auto")
    metrics.relabel("bf16")  # as the measurement settles it
    metrics.measured_steps({"bf16": 0.1, "fp32": 0.3})
    metrics.changed(change(source="bf16", to="fp32"))
    return generate_latest(metrics.registry).decode()


def test_a_read_after_a_change_names_the_precision_measured_not_the_one_trained_in_now() -> None:
    """The read took the precision the attempt trains in now for the one it measured: after a
    fallback in place to fp32, the job said AMP was slower than fp32 though bf16 was 3x faster."""
    assert read_measurement(parse(served_after_a_change())) == ("bf16", {"bf16": 0.1, "fp32": 0.3})
    s = spec()
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change(source="bf16", to="fp32")])
    seen = observe(plan.status, reading_of(parse(served_after_a_change()), attempt=1))
    assert seen.status.attempts[0].measured_step_seconds == {"bf16": 0.1, "fp32": 0.3}
    assert [c.type for c in seen.status.conditions if c.type == "AmpSlowerThanFp32"] == [] and seen.told() == []
