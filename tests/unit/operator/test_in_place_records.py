"""The operator's record of fallbacks made in place: a change read from the running attempt's
metrics (or, when no read caught it, from its Job's termination report) ends the attempt as a
restart's fault would and begins the next one in the same Job, once; the Job is never deleted
or created for it; the attempts' GPU-seconds split the Job's time; the read parses the
trainer's series and drops what the trainer could not have written."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mpjob.controller.exposition import parse
from mpjob.controller.progress import Target, changes_found, figures, found_reading, observed_in
from mpjob.planning import history, lifecycle
from mpjob.planning.cost import seen_usage
from mpjob.planning.inplace import InPlacePlan, in_place_plan
from mpjob.planning.observe import observe
from mpjob.planning.planner import first_attempt
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import FinishReason, Reason
from mpjob_contract.launch import InPlaceTarget
from mpjob_contract.report import CheckpointRef, InPlaceChange, TerminationReport
from tests.unit.operator import carried_out

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
EARLIER, LATER = NOW - timedelta(seconds=60), NOW - timedelta(seconds=30)
MESSAGE = "MaxNonFiniteLosses: 5 non-finite losses in this attempt; fp32 replayed steps 43-46 finitely"


def spec(**over: object) -> MixedPrecisionJobSpec:
    doc = {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]}, **over}
    return MixedPrecisionJobSpec.model_validate(doc)


def change(
    attempt: int = 1, *, source: str = "fp16", to: str = "bf16", step: int = 50, at: datetime | None = None
) -> InPlaceChange:
    return InPlaceChange.model_validate(
        {"attempt": attempt, "step": step, "startStep": 40, "fromPrecision": source, "toPrecision": to,
         "rule": "MaxNonFiniteLosses", "message": MESSAGE, "recoverySeconds": 0.25, "at": at and at.timestamp()}
    )  # fmt: skip


def running(started: datetime = NOW - timedelta(seconds=100), *, ended: str | None = None, report: str = "") -> JobView:
    alive = ended is None
    pod = PodView(
        "p0", 0, "Running" if alive else "Succeeded", alive=alive, exit_code=None if alive else 0,
        started_at=started.isoformat(), finished_at=None if alive else NOW.isoformat(), termination_message=report,
    )  # fmt: skip
    return JobView(0, finished=ended, pods=(pod,))


def started(s: MixedPrecisionJobSpec) -> MixedPrecisionJobStatus:
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW - timedelta(seconds=100)).status
    return reconcile(s, first, 1, {0: running()}, NOW - timedelta(seconds=90)).status


def test_a_change_read_ends_the_attempt_and_begins_the_next_in_the_same_job() -> None:
    s = spec(resources={"gpusPerWorker": 1})
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change()])
    first, second = plan.status.attempts
    assert (first.reason, first.end_step, first.precision) == (Reason.NUMERIC_FAULT.value, 50, "fp16")
    assert (second.index, second.precision, second.start_step, second.in_place) == (1, "bf16", 40, True)
    assert second.recovery_seconds == 0.25 and second.finish_time is None
    assert (plan.status.attempt, plan.status.precision, plan.status.phase) == (1, "bf16", "Running")
    assert plan.create == [] and plan.delete == []  # no Job made or ended for it
    assert plan.fallbacks == [("fp16", "bf16")]
    assert any(e.reason == "PrecisionFallback" for e in plan.events)
    assert first.message.startswith("MaxNonFiniteLosses: 5 non-finite losses")
    assert first.gpu_seconds == pytest.approx(100.0)  # the Job's time so far: its pod, one GPU
    assert history.job_index(plan.status, 1) == 0


def test_the_attempt_begun_in_place_is_said_running_not_waiting_for_pods() -> None:
    """Its processes train on: the Running condition names it True from the change's moment, on
    the reconcile that records it and on every one after, as the phase does; no pod is awaited."""
    s = spec(resources={"gpusPerWorker": 1})
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change(at=LATER)])
    later = reconcile(s, plan.status, 1, {0: running()}, NOW + timedelta(seconds=10)).status
    for status in (plan.status, later):
        ran = next(c for c in status.conditions if c.type == "Running")
        assert (status.phase, ran.status, ran.reason, ran.message) == (
            "Running", "True", "AttemptRunning", "attempt 1 in bf16"
        )  # fmt: skip
        assert ran.last_transition_time == LATER.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_change_read_again_after_an_operator_restart_is_recorded_once() -> None:
    s = spec()
    once = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change()]).status
    again = reconcile(s, once, 1, {0: running()}, NOW + timedelta(seconds=5), changes=[change()])
    assert [a.index for a in again.status.attempts] == [0, 1] and again.events == []
    assert again.create == [] and again.delete == []


def test_a_read_that_lists_a_change_holds_the_new_attempts_figures_once_the_plan_recorded_it() -> None:
    """The operator applies a read before it plans (`observed_in`): the figures of a read of
    attempt 0 that lists the change to attempt 1 are attempt 1's (bf16 at step 52), so they go
    in only once the plan has recorded that change, never into attempt 0's."""
    s, target = spec(), Target(attempt=0, ip="10.0.0.1", precision="fp16")
    found = {"step": 52, "loss": 1.5, "precisionChanges": [change().model_dump(by_alias=True)]}
    status = started(s)
    held = observed_in(status, (target, found), changes_found(found), NOW, 200)
    assert held.status == status and held.news is None  # attempt 0's figures are left as they were
    recorded = reconcile(s, held.status, 1, {0: running()}, NOW, changes=changes_found(found)).status
    moved = observed_in(recorded, (replace(target, attempt=1), found), changes_found(found), NOW, 200).status
    assert (moved.step, moved.loss, moved.attempts[-1].index, moved.attempts[-1].progress_time) == (
        52,
        1.5,
        1,
        "2026-11-29T12:00:00Z",
    )


def test_a_change_that_does_not_follow_the_running_attempt_changes_nothing() -> None:
    s = spec()
    status = started(s)
    for other in (change(2), change(1, source="bf16", to="fp32")):
        plan = reconcile(s, status, 1, {0: running()}, NOW, changes=[other])
        assert [a.index for a in plan.status.attempts] == [0] and plan.status.precision == "fp16"


def test_changes_no_read_caught_are_recorded_from_the_report_before_the_ending() -> None:
    s = spec(resources={"gpusPerWorker": 1})
    ref = CheckpointRef(step=100, path="/ckpt/step-100", sha256="ab", precision="fp32")
    report = TerminationReport(
        reason=Reason.SUCCEEDED, step=100, start_step=40, precision="fp32", last_good_checkpoint=ref,
        precision_changes=[change(at=EARLIER), change(2, source="bf16", to="fp32", step=60, at=LATER)],
        loss_scales=[(10, 32768.0), (45, 512.0)],  # the process's history: fp16's, attempt 0's
    ).to_message()  # fmt: skip
    plan = reconcile(s, started(s), 1, {0: running(ended="Complete", report=report)}, NOW)
    assert [(a.precision, a.reason, a.in_place) for a in plan.status.attempts] == [
        ("fp16", "NumericFault", None),
        ("bf16", "NumericFault", True),
        ("fp32", "Succeeded", True),
    ]
    assert plan.status.phase == "Succeeded" and plan.create == []
    assert [(p.step, p.attempt) for p in plan.status.timeline.loss_scale] == [(10, 0), (45, 0)]
    # the one Job's 100 s, split where the trainer changed: 40 s, 30 s, 30 s
    assert [a.gpu_seconds for a in plan.status.attempts] == [
        pytest.approx(40.0),
        pytest.approx(30.0),
        pytest.approx(30.0),
    ]
    assert plan.status.attempts[1].start_time == (NOW - timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_change_recorded_before_any_checkpoint_was_read_says_where_the_trainer_went_on() -> None:
    """A short run ends within one tick: the operator learns of the change and of checkpoint 40
    from the report together. Its events say step 40, as the status does, not the plan's 0."""
    s = spec()
    report = TerminationReport(
        reason=Reason.SUCCEEDED, step=100, start_step=40, precision="bf16", precision_changes=[change(at=EARLIER)]
    ).to_message()
    plan = reconcile(s, started(s), 1, {0: running(ended="Complete", report=report)}, NOW)
    assert plan.status.attempts[1].start_step == 40
    said = carried_out.said(s, plan, "PrecisionFallback", "AttemptStarted")
    assert said == ["fp16 -> bf16 after NumericFault, to resume from checkpoint step 40",
                    "attempt 1 in bf16, to resume from checkpoint step 40"]  # fmt: skip
    fallback = next(c for c in plan.status.conditions if c.type == "PrecisionFallback")
    assert fallback.message == "fp16 -> bf16 from checkpoint step 40"


def test_the_in_place_attempt_is_charged_what_its_job_ran_after_the_one_before() -> None:
    s = spec(resources={"gpusPerWorker": 2})
    status = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change()]).status
    status.attempts[1].finish_time = (NOW + timedelta(seconds=60)).strftime("%Y-%m-%dT%H:%M:%SZ")
    usage = seen_usage(status, {0: running()}, s, NOW + timedelta(seconds=60))
    assert usage == {1: pytest.approx(2 * 160.0 - status.attempts[0].gpu_seconds)}
    assert status.attempts[0].gpu_seconds == pytest.approx(200.0)


@pytest.mark.parametrize(
    ("at", "ended"),
    [
        (999_999_999_999.0, NOW),  # the largest moment a read admits: past the year 9999
        (2.0**53 - 1, NOW),  # the largest a report admits
        (0.0, NOW - timedelta(seconds=100)),  # before the attempt began: it ends no earlier
    ],
    ids=["past-year-9999", "largest-report", "before-the-attempt"],
)
def test_a_change_moment_no_clock_could_say_is_held_to_the_attempts_time(at: float, ended: datetime) -> None:
    """The moment is the trainer's word: one a date cannot hold never stops the reconcile, and
    one outside the attempt's own time (its start to now) ends it at the nearer end."""
    s = spec(resources={"gpusPerWorker": 1})
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change().model_copy(update={"at": at})])
    first, second = plan.status.attempts
    stamp = ended.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (first.finish_time, second.start_time, second.precision) == (stamp, stamp, "bf16")
    assert first.start_time is not None and first.start_time <= stamp


def exposition(*series: str) -> str:
    head = f"# HELP {tm.PRECISION_CHANGE} in place\n# TYPE {tm.PRECISION_CHANGE} gauge\n"
    return head + "".join(f"{tm.PRECISION_CHANGE}{{{labels}}} 0.25\n" for labels in series)


GOOD = 'job="j",namespace="n",attempt="1",precision="bf16",step="50",start_step="40",'
GOOD += f'from_precision="fp16",to_precision="bf16",rule="MaxNonFiniteLosses",message="{MESSAGE}",at=""'


def test_a_read_parses_the_trainers_change_series() -> None:
    found = figures(parse(exposition(GOOD)), precision="fp16")
    assert changes_found(found) == [change()]


@pytest.mark.parametrize(
    "hostile",
    [
        GOOD.replace('attempt="1"', 'attempt="0"'),  # no attempt begins at 0
        GOOD.replace('step="50"', 'step="-3"'),
        GOOD.replace('to_precision="bf16"', 'to_precision="fp4"'),
        GOOD.replace('rule="MaxNonFiniteLosses"', 'rule="rm -rf /"'),
        GOOD.replace('start_step="40"', 'start_step="9999999999999999999"'),
        GOOD.replace('at=""', 'at="yesterday"'),
    ],
)
def test_a_change_series_the_trainer_could_not_have_written_is_no_change(hostile: str) -> None:
    assert changes_found(figures(parse(exposition(hostile)), precision="fp16")) == []


def test_a_long_message_is_cut_not_refused() -> None:
    found = changes_found(figures(parse(exposition(GOOD.replace(MESSAGE, "x" * 2000))), precision="fp16"))
    assert len(found) == 1 and len(found[0].message) == 512


def test_a_restarted_attempt_records_the_trainers_recovery_once_from_a_read_or_its_report() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16"], "inPlace": False})
    fault = TerminationReport(reason=Reason.NUMERIC_FAULT, step=50, precision="fp16", ended_at=1.0e9).to_message()
    failed = JobView(0, finished="Failed", pods=(PodView("p", 0, "Failed", alive=False, exit_code=42,
                                                         termination_message=fault),))  # fmt: skip
    plan = reconcile(s, started(s), 1, {0: failed}, NOW)
    assert plan.create[0].recovering_since == 1.0e9  # the next attempt's launch counts from the fault
    read = figures(parse(f"{tm.RECOVERY_SECONDS} 4.2\n{tm.STEP} 45\n{tm.START_STEP} 40\n"), precision="bf16")
    assert read["recoverySeconds"] == 4.2
    running = observe(plan.status, found_reading(read)).status
    assert running.attempts[1].recovery_seconds == 4.2
    again = observe(running, found_reading({**read, "recoverySeconds": 9.9})).status
    assert again.attempts[1].recovery_seconds == 4.2  # once
    unread = TerminationReport(reason=Reason.SUCCEEDED, step=60, precision="bf16", recovery_seconds=3.5)
    done = JobView(1, finished="Complete", pods=(PodView("q", 0, "Succeeded", alive=False, exit_code=0,
                                                         termination_message=unread.to_message()),))  # fmt: skip
    ended = reconcile(s, plan.status, 1, {1: done}, NOW).status
    assert ended.phase == "Succeeded" and ended.attempts[1].recovery_seconds == 3.5
    assert figures(parse(f"{tm.RECOVERY_SECONDS} -1\n"), precision="bf16").get("recoverySeconds") is None


def test_a_repromotion_in_place_ends_the_fallback_attempt_repromoted_and_begins_the_faster_one() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10})
    fell = reconcile(s, started(s), 1, {0: running()}, NOW - timedelta(seconds=20), changes=[change()]).status
    assert fell.attempts[1].precision == "bf16"
    up = InPlaceChange.model_validate(
        {"kind": "repromote", "attempt": 2, "step": 60, "startStep": 60, "fromPrecision": "bf16",
         "toPrecision": "fp16", "rule": "repromote", "message": "20 clean steps in bf16; checkpoint at step 60 written",
         "recoverySeconds": 0.01}
    )  # fmt: skip
    plan = reconcile(s, fell, 1, {0: running()}, NOW, changes=[up])
    _, fallback, promoted = plan.status.attempts
    assert (fallback.reason, fallback.end_step, fallback.charged) == (Reason.REPROMOTE.value, 60, True)
    assert (promoted.precision, promoted.start_step, promoted.in_place, promoted.repromoted) == ("fp16", 60, True, True)
    assert plan.create == [] and plan.delete == [] and plan.status.precision == "fp16"
    (said,) = [e.message for e in plan.events if e.reason == "PrecisionRepromoted"]
    # 20 clean steps passed (the trainer's ending says so): the setting is the least, not the count
    assert "after at least 10 clean steps" in said and "from checkpoint step 60" in said, said
    assert history.job_index(plan.status, 2) == 0  # the same Job all along


def test_in_place_plans_name_where_a_fallback_attempt_is_repromoted() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10})
    status = started(s)
    start = first_attempt(s)
    plan = in_place_plan(s, start, status)
    assert [(t.precision, t.repromote_after_steps, t.shape) for t in plan.to] == [
        ("bf16", 10, None),
        ("fp32", 10, (8, 2)),
    ]
    assert plan.to[0].promote_to is not None and plan.to[0].promote_to.precision == "fp16"
    assert plan.promote_to is None  # the first attempt has no re-promotion of its own
    restarted = replace(start, index=1, precision="bf16", start_step=40, fallback_from="fp16", repromote_after_steps=10)
    # The re-promoted fp16 falls back to bf16 in place in turn, with no re-promotion of its own
    # (then to fp32 in its split).
    fp16_again = in_place_plan(s, restarted, status).promote_to
    assert fp16_again is not None and (fp16_again.precision, fp16_again.repromote_after_steps) == ("fp16", None)
    assert fp16_again.in_place_to[0] == InPlaceTarget(precision="bf16")
    assert [(t.precision, t.shape) for t in fp16_again.in_place_to[1:]] == [("fp32", (8, 2))]
    off = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 10, "inPlace": False})
    assert in_place_plan(off, restarted, status) == InPlacePlan()


@pytest.mark.parametrize(("max_attempts", "then"), [(None, ["bf16", "fp32"]), (4, ["bf16"]), (3, [])])
def test_a_repromoted_attempts_own_fallbacks_are_planned_in_place_within_the_attempt_budget(
    max_attempts: int | None, then: list[str]
) -> None:
    """fp16 faults, bf16 in place, fp16 again in place after 10 clean steps: when that faults
    too, bf16 goes on in place once more (a fourth attempt: within maxAttempts 4, not 3)."""
    run_policy = {} if max_attempts is None else {"runPolicy": {"maxAttempts": max_attempts}}
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10}, **run_policy)
    bf16, *_ = in_place_plan(s, first_attempt(s), started(s)).to
    assert bf16.promote_to is not None and bf16.promote_to.precision == "fp16"
    assert [t.precision for t in bf16.promote_to.in_place_to] == then
    for last in bf16.promote_to.in_place_to:  # a re-promoted precision that faulted is not tried again
        assert all(t.precision != "fp16" for t in last.targets())


def test_a_repromotion_to_fp8_restarts() -> None:
    s = spec(
        precision={"mode": "fp8", "fallback": ["bf16"], "repromoteAfterSteps": 10, "fp8": {"emulate": True}},
        resources={"gpusPerWorker": 1, "minComputeCapability": "9.0"},
    )
    (target,) = in_place_plan(s, first_attempt(s), started(s)).to
    assert target.precision == "bf16" and target.repromote_after_steps == 10 and target.promote_to is None


def test_an_attempt_begun_in_place_whose_job_is_made_again_runs_in_that_job() -> None:
    """Attempt 1 began in place in attempt 0's Job, which was then deleted while it ran: the Job
    made again for it is attempt 1's own, yet rank 0 was still read, the cost split and the
    lineage given by attempt 0's Job, which was gone."""
    s = spec(resources={"gpusPerWorker": 1})
    status = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change()]).status
    status.attempts[0].job_uid = "uid-a0"
    again = reconcile(s, status, 1, {}, NOW + timedelta(seconds=5))  # attempt 0's Job is gone
    assert [c.index for c in again.create] == [1]
    assert history.job_index(again.status, 1) == 0  # its Job is not made yet: it last ran in attempt 0's
    held = {1: history.HeldJob("uid-a1")}
    assert history.own(again.status, held) == {1: "uid-a1"}
    own = replace(running(NOW + timedelta(seconds=8)), index=1)
    made = reconcile(s, again.status, 1, {1: own}, NOW + timedelta(seconds=10))
    lifecycle.made(made, s, 1, "uid-a1")  # as the reconcile that sees the Job records it
    assert history.job_index(made.status, 1) == 1
    later = reconcile(
        s, made.status, 1, {1: own}, NOW + timedelta(seconds=20), changes=[change(2, source="bf16", to="fp32")]
    )
    assert [(a.index, a.in_place) for a in later.status.attempts][1:] == [(1, True), (2, True)]
    assert history.job_index(later.status, 2) == 1  # the next change in place goes on in attempt 1's Job
    # A later attempt may resume from what attempt 1 wrote in either Job, and attempt 2 in attempt 1's.
    assert history.lineage(later.status, 3) == {0: ["uid-a0"], 1: ["uid-a0", "uid-a1"], 2: ["uid-a1"]}
    assert later.status.attempts[1].gpu_seconds == pytest.approx(12.0)  # its own Job's time, none of attempt 0's


def test_a_change_that_leaves_no_attempt_fails_the_job_and_ends_its_job_once() -> None:
    """runPolicy.maxAttempts lowered while the attempt runs (docs/walkthrough.md: the next ending
    that needs another attempt fails the job): the trainer, planned under the old bound, changes in
    place; the operator fails the job AttemptsExhausted and deletes the Job that trains on, rather
    than following an attempt it ended. Its report, listing the change, ends nothing a second time."""
    s = spec(resources={"gpusPerWorker": 1})
    lowered = spec(resources={"gpusPerWorker": 1}, runPolicy={"maxAttempts": 1})
    plan = reconcile(lowered, started(s), 2, {0: running()}, NOW, changes=[change()])
    assert (plan.status.phase, failed_by(plan.status)) == ("Failed", FinishReason.ATTEMPTS_EXHAUSTED.value)
    assert [(a.index, a.reason) for a in plan.status.attempts] == [(0, Reason.NUMERIC_FAULT.value)]
    assert plan.delete == [0] and plan.create == []
    report = TerminationReport(
        reason=Reason.SUCCEEDED, step=100, start_step=40, precision="bf16", precision_changes=[change()]
    ).to_message()
    for status in (plan.status, started(s)):  # the change read before, or only in the report
        ended = reconcile(lowered, status, 2, {0: running(ended="Complete", report=report)}, NOW + timedelta(seconds=5))
        assert (ended.status.phase, failed_by(ended.status)) == ("Failed", FinishReason.ATTEMPTS_EXHAUSTED.value)
        assert [(a.index, a.reason) for a in ended.status.attempts] == [(0, Reason.NUMERIC_FAULT.value)]
        assert sum(e.reason == "AttemptEnded" for e in ended.events) == (status is not plan.status)


def failed_by(status: MixedPrecisionJobStatus) -> str | None:
    return next((c.reason for c in status.conditions if c.type == "Failed" and c.status == "True"), None)


def test_a_change_read_as_the_deadline_passes_is_recorded_before_the_deadline_ends_the_job() -> None:
    """The read that finds the change is the reconcile that finds the deadline past: the attempt
    the trainer went on in is the one the deadline ends, in the precision it trained in."""
    s = spec(resources={"gpusPerWorker": 1}, runPolicy={"activeDeadlineSeconds": 60})
    plan = reconcile(s, started(s), 1, {0: running()}, NOW, changes=[change()])
    assert [(a.index, a.precision, a.reason, a.in_place) for a in plan.status.attempts] == [
        (0, "fp16", Reason.NUMERIC_FAULT.value, None),
        (1, "bf16", Reason.DEADLINE_EXCEEDED.value, True),
    ]
    assert (plan.status.phase, plan.status.precision, failed_by(plan.status)) == ("Failed", "bf16", "DeadlineExceeded")
    assert plan.delete == [0] and plan.create == []


def test_a_change_after_the_fallbacks_were_edited_is_told_as_the_trainer_made_it() -> None:
    """precision.fallback edited while the attempt runs reaches the next attempt the operator
    starts; the trainer, launched before, falls back in place as its launch said. Its Events,
    condition and fallback count name the precision it went on in, as its attempt does."""
    s = spec(resources={"gpusPerWorker": 1})
    edited = spec(resources={"gpusPerWorker": 1}, precision={"mode": "fp16", "fallback": ["fp32"]})
    plan = reconcile(edited, started(s), 2, {0: running()}, NOW, changes=[change()])
    assert [(a.index, a.precision) for a in plan.status.attempts] == [(0, "fp16"), (1, "bf16")]
    assert (plan.status.precision, plan.status.phase, plan.fallbacks) == ("bf16", "Running", [("fp16", "bf16")])
    told = [e.message for e in plan.events if e.reason in ("PrecisionFallback", "AttemptStarted")]
    assert told and all("fp32" not in m for m in told) and any("fp16 -> bf16" in m for m in told)
    fell = next(c for c in plan.status.conditions if c.type == "PrecisionFallback")
    assert fell.message.startswith("fp16 -> bf16")
