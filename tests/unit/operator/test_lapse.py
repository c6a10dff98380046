"""Checkpoints that stop coming while training goes on (planning/lapse.py): a run whose bucket
went away trained from step 20 to 200 with every save failing, and nothing but one line per
failed save said so. The CheckpointsFailing condition flips once per lapse, with its Event, for
`mpjob run`'s trainer lines and the operator's reads alike."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from mpjob.controller.progress import found_reading
from mpjob.localrun.readings import reading_of
from mpjob.planning.lapse import LAPSED_INTERVALS
from mpjob.planning.observe import Observation, Reading, observe
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract import events
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT as CHECKPOINTS
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit

EVERY = 10
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def fresh() -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus(
        phase="Running", precision="fp32", attempt=0, attempts=[AttemptStatus(index=0, precision="fp32", start_step=0)]
    )


def line(**fields: object) -> events.TrainerEvent:
    event = events.parse_line(json.dumps({"time": 1.0, **fields}))
    assert event is not None
    return event


def step(n: int) -> events.TrainerEvent:
    return line(event="step", step=n, loss=1.0)


def saved(n: int) -> events.TrainerEvent:
    return line(
        event="checkpoint", step=n, path=f"/c/step-{n:09d}", sha256="ab" * 32, seconds=0.1, bytes=10, **{"async": True}
    )


def failed(n: int, k: int) -> events.TrainerEvent:
    return line(event="checkpointFailed", step=n, trainingStep=n, error="OSError: EndpointConnectionError", failures=k)


def feed(
    status: MixedPrecisionJobStatus, lines: list[events.TrainerEvent]
) -> tuple[MixedPrecisionJobStatus, list[Observation]]:
    """`lines` as `mpjob run` reads them; the observations that told something."""
    told = []
    for event in lines:
        reading = reading_of(0, event)
        if reading is None:
            continue
        seen = observe(status, reading, every_steps=EVERY)
        status = seen.status
        told += [seen] if seen.told() else []
    return status, told


def condition(status: MixedPrecisionJobStatus) -> tuple[str, str] | None:
    found = [(c.status, c.reason) for c in status.conditions if c.type == "CheckpointsFailing"]
    return found[0] if found else None


def test_saves_failing_for_three_intervals_warn_once_and_a_save_clears_it() -> None:
    status, told = feed(fresh(), [step(n) for n in range(1, 21)] + [saved(20)])
    assert told == [] and condition(status) is None  # never lapsed: no condition at all
    outage = []
    for n in range(21, 20 + LAPSED_INTERVALS * EVERY + 15):
        outage += [step(n)] + ([failed(n, n // EVERY - 2)] if n % EVERY == 0 else [])
    status, told = feed(status, outage)
    assert len(told) == 1 and told[0].lapse is not None  # once, at step 50, not at each failure after
    kind, reason, message = told[0].lapse.type, told[0].lapse.reason, told[0].lapse.message
    assert (kind, reason) == ("Warning", "CheckpointsFailing") and condition(status) == ("True", "CheckpointsFailing")
    assert "no checkpoint for 30 step(s) (checkpoint step 20, step 50 now" in message
    assert told[0].lines() == [f"warning: {message}"]
    status, told = feed(status, [saved(60), step(65)])
    assert [(seen.lapse.type, seen.lapse.reason) for seen in told if seen.lapse] == [("Normal", "CheckpointsCurrent")]
    assert condition(status) == ("False", "CheckpointsCurrent") and status.last_checkpoint is not None
    assert "checkpoint step 60, 4 step(s) before step 64" in told[0].lines()[0]


def test_a_run_with_no_checkpoint_yet_lapses_from_step_0() -> None:
    _, told = feed(fresh(), [step(n) for n in range(1, LAPSED_INTERVALS * EVERY + 1)])
    assert len(told) == 1 and told[0].lapse is not None and "no checkpoint yet" in told[0].lapse.message


def test_the_operators_read_of_the_metrics_lapses_the_same_way() -> None:
    """A read of rank 0's metrics endpoint names the step and the last good checkpoint's step."""
    status = observe(fresh(), Reading(step=25), every_steps=EVERY).status
    status = observe(status, found_reading({"step": 49, "lastCheckpointStep": 20}), every_steps=EVERY).status
    assert condition(status) is None
    seen = observe(
        status, found_reading({"step": 50, "lastCheckpointStep": 20}), at="2026-01-01T00:00:00Z", every_steps=EVERY
    )
    assert [(t.type, t.reason) for t in seen.told()] == [("Warning", "CheckpointsFailing")]
    assert seen.status.to_api()["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    again = observe(seen.status, found_reading({"step": 51, "lastCheckpointStep": 20}), every_steps=EVERY)
    assert again.told() == []  # the status is the memory: an operator that restarts tells it once


def test_without_the_spec_s_interval_no_condition_is_kept() -> None:
    status = observe(fresh(), Reading(step=500), every_steps=None).status
    assert condition(status) is None


def test_a_report_whose_checkpoint_catches_up_clears_the_condition_no_reading_will() -> None:
    """Suspended while lapsed: the trainer checkpointed at step 62 on SIGTERM and its report says
    so, but only a reading flipped the condition, and none comes to a suspended job: it said
    'no checkpoint for 40 step(s) ... training goes on', in `mpjob status` and the operator's
    jobs_in_trouble, for the whole suspension (or for good, on a job that ended)."""
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "training": {"steps": 100}, "checkpoint": {**CLAIM, "everySteps": EVERY}}
    )
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    running = {0: JobView(0, pods=(PodView("p0", 0, "Running", True, started_at="2026-01-01T00:00:01Z"),))}
    status = reconcile(spec, status, 1, running, T0).status
    status = observe(status, found_reading({"step": 60, "lastCheckpointStep": 20}, attempt=0), every_steps=EVERY).status
    assert condition(status) == ("True", "CheckpointsFailing")
    held = spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})
    status = reconcile(held, status, 2, running, T0).status
    ref = CheckpointRef(step=62, path=f"{CHECKPOINTS}/step-000000062", sha256="ab" * 32, precision="fp16")
    said = TerminationReport(reason=Reason.PREEMPTED, step=62, start_step=0, precision="fp16", last_good_checkpoint=ref)
    stopped = {0: JobView(0, pods=(PodView("p0", 0, "Failed", False, 44, said.to_message()),))}
    plan = reconcile(held, status, 2, {}, T0, stopped=stopped)
    assert plan.status.phase == "Suspended" and plan.status.last_checkpoint is not None
    assert condition(plan.status) == ("False", "CheckpointsCurrent")
    told = [(e.type, e.reason) for e in plan.told if e.reason == "CheckpointsCurrent"]
    assert told == [("Normal", "CheckpointsCurrent")]
