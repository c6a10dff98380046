"""The failure policy, the planner and the pure reconcile, with plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.classify import FAILURE_POLICY, Action, AttemptOutcome, classify
from mpjob.planning.inplace import InPlacePlan
from mpjob.planning.launch import attempt_launch
from mpjob.planning.lifecycle import record_report
from mpjob.planning.planner import (
    BatchShape,
    Finish,
    StartAttempt,
    after_attempt,
    first_attempt,
    ladder,
    promotion_target,
)
from mpjob.planning.reconcile import JobView, PodView, ended_by_pods, reconcile
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator import carried_out
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def spec(**over: object) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "checkpoint": {"everySteps": 200, **CLAIM}, **over}
    )


def report(reason: Reason, step: int = 30, ckpt: int | None = 20, message: str = "m") -> str:
    path = f"{CHECKPOINT_MOUNT}/step-{ckpt}"
    ref = CheckpointRef(step=ckpt, path=path, sha256="ab", precision="fp16") if ckpt else None
    return TerminationReport(
        reason=reason, step=step, precision="fp16", last_good_checkpoint=ref, message=message
    ).to_message()


@pytest.mark.parametrize(
    ("outcome", "reason", "action"),
    [
        (AttemptOutcome(0), Reason.SUCCEEDED, Action.SUCCEED),
        (AttemptOutcome(42), Reason.NUMERIC_FAULT, Action.NEXT_PRECISION),
        (AttemptOutcome(43), Reason.CONFIG_ERROR, Action.FAIL),
        (AttemptOutcome(44), Reason.PREEMPTED, Action.SAME_PRECISION),
        (AttemptOutcome(1), Reason.INFRA_ERROR, Action.SAME_PRECISION),
        (AttemptOutcome(137), Reason.DELETED, Action.SAME_PRECISION),
        (AttemptOutcome(None, platform_reason="Evicted"), Reason.EVICTED, Action.SAME_PRECISION),
        (AttemptOutcome(137, platform_reason="OOMKilled"), Reason.OOM_KILLED, Action.FAIL),
        (AttemptOutcome(None, platform_reason="ImagePullBackOff"), Reason.IMAGE_PULL, Action.FAIL),
        (AttemptOutcome(None, platform_reason="DeadlineExceeded"), Reason.DEADLINE_EXCEEDED, Action.FAIL),
        (AttemptOutcome(None, platform_reason="DeletionByTaintManager"), Reason.NODE_LOST, Action.SAME_PRECISION),
    ],
)
def test_failure_policy_table(outcome: AttemptOutcome, reason: Reason, action: Action) -> None:
    result = classify(outcome)
    assert (result.reason, result.action) == (reason, action)


def test_every_reason_has_exactly_one_rule() -> None:
    reasons = [rule.reason for rule in FAILURE_POLICY]
    assert len(reasons) == len(set(reasons)) == len(Reason)


def test_auto_resolves_against_min_compute_capability() -> None:
    assert ladder(spec(resources={"gpusPerWorker": 1, "minComputeCapability": "8.0"})) == ["bf16", "fp32"]
    assert ladder(spec(resources={"gpusPerWorker": 1, "minComputeCapability": "7.0"})) == ["fp16", "bf16", "fp32"]
    assert ladder(spec(resources={"gpusPerWorker": 0})) == ["bf16", "fp32"]
    assert first_attempt(spec(precision={"mode": "fp32"})).precision == "fp32"


def test_numeric_fault_walks_the_ladder_from_the_last_good_checkpoint() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"]})
    fault = classify(AttemptOutcome(42, TerminationReport.parse_message(report(Reason.NUMERIC_FAULT))))
    nxt = after_attempt(s, 0, "fp16", fault, 20, f"{CHECKPOINT_MOUNT}/step-20")
    assert nxt == StartAttempt(
        1, "bf16", f"{CHECKPOINT_MOUNT}/step-20", 20, fallback_from="fp16", micro_batch=16, grad_accumulation=1
    )
    last = after_attempt(s, 2, "fp32", fault, 20, f"{CHECKPOINT_MOUNT}/step-20")
    assert isinstance(last, Finish) and not last.succeeded and last.reason == "NoPrecisionLeft"


def test_a_fallback_into_fp32_splits_the_micro_batch_and_keeps_samples_per_step() -> None:
    s = spec(
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]}, training={"batchSize": 12, "gradAccumulation": 2}
    )
    fault = classify(AttemptOutcome(42))
    to_bf16 = after_attempt(s, 0, "fp16", fault, 0, None)
    assert isinstance(to_bf16, StartAttempt) and to_bf16.shape == BatchShape(12, 2)  # same activation width
    to_fp32 = after_attempt(s, 1, "bf16", fault, 0, None, shape=to_bf16.shape)
    assert isinstance(to_fp32, StartAttempt) and to_fp32.precision == "fp32"
    assert to_fp32.shape == BatchShape(6, 4)
    kept = spec(precision={"mode": "bf16", "fallback": ["fp32"], "fallbackKeepsBatch": False})
    plain = after_attempt(kept, 0, "bf16", fault, 0, None)
    assert isinstance(plain, StartAttempt) and plain.shape == BatchShape(16, 1)


def test_running_out_of_gpu_memory_retries_the_same_precision_with_a_split_micro_batch() -> None:
    s = spec(precision={"mode": "fp16"}, training={"batchSize": 9})
    oom = classify(AttemptOutcome(46))
    assert oom.reason == Reason.OUT_OF_DEVICE_MEMORY
    nxt = after_attempt(s, 0, "fp16", oom, 30, None)
    assert isinstance(nxt, StartAttempt) and (nxt.precision, nxt.shape, nxt.start_step) == (
        "fp16",
        BatchShape(3, 3),
        30,
    )
    last = after_attempt(s, 2, "fp16", oom, 30, None, shape=BatchShape(1, 9))
    assert isinstance(last, Finish) and last.reason == "OutOfDeviceMemory" and "one sample" in last.message
    host = classify(AttemptOutcome(137, platform_reason="OOMKilled"))
    assert host.action is Action.FAIL  # the kernel's OOM killer: host memory, not the GPU's


def test_batch_shape_split_divides_by_the_smallest_prime_factor() -> None:
    assert [BatchShape(b, 1).split() for b in (16, 12, 9, 7, 1)] == [
        BatchShape(8, 2),
        BatchShape(6, 2),
        BatchShape(3, 3),
        BatchShape(1, 7),
        None,
    ]


def test_a_fault_fp32_replayed_too_fails_the_job_without_another_attempt() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"]})
    data = classify(AttemptOutcome(45, TerminationReport.parse_message(report(Reason.NON_FINITE_IN_FP32))))
    done = after_attempt(s, 0, "fp16", data, 20, None)
    assert isinstance(done, Finish) and not done.succeeded and done.reason == "NonFiniteInFp32"


def test_attempts_are_bounded_by_max_attempts() -> None:
    s = spec(runPolicy={"maxAttempts": 2})
    preempted = classify(AttemptOutcome(44))
    assert isinstance(after_attempt(s, 0, "bf16", preempted, 10, None), StartAttempt)
    done = after_attempt(s, 1, "bf16", preempted, 10, None)
    assert isinstance(done, Finish) and done.reason == "AttemptsExhausted"


def _status(**kw: object) -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(kw)


def test_a_new_job_starts_attempt_zero_and_records_it_first() -> None:
    plan = reconcile(spec(precision={"mode": "fp16"}), _status(), 1, {}, NOW)
    assert [(c.index, c.precision) for c in plan.create] == [(0, "fp16")]
    # Pending until a trainer pod runs (issue 14): its pods may never be created.
    assert plan.status.attempts[0].index == 0 and plan.status.phase == "Pending"
    assert plan.status.observed_generation == 1


def test_each_attempt_records_its_world_size() -> None:
    s = spec(workers=2, resources={"gpusPerWorker": 0, "processesPerWorker": 2})
    plan = reconcile(s, _status(), 1, {}, NOW)
    assert plan.status.attempts[0].world_size == 4
    assert plan.status.attempts[0].to_api()["worldSize"] == 4


def test_a_recorded_attempt_without_its_job_is_created_again_with_the_same_index() -> None:
    first = reconcile(spec(precision={"mode": "fp16"}), _status(), 1, {}, NOW).status
    again = reconcile(spec(precision={"mode": "fp16"}), first, 1, {}, NOW)
    assert [c.index for c in again.create] == [0]
    assert len(again.status.attempts) == 1  # never a second attempt


def test_a_running_job_is_left_alone() -> None:
    first = reconcile(spec(), _status(), 1, {}, NOW).status
    running = {0: JobView(0, pods=(PodView("p", 0, "Running", alive=True),))}
    plan = reconcile(spec(), first, 1, running, NOW)
    assert plan.create == [] and plan.delete == [] and plan.status.phase == "Running"


def test_a_numeric_fault_starts_the_next_precision() -> None:
    s = spec(precision={"mode": "fp16"})
    first = reconcile(s, _status(), 1, {}, NOW).status
    failed = {
        0: JobView(
            0,
            finished="Failed",
            reason="BackoffLimitExceeded",
            pods=(
                PodView("p", 0, "Failed", alive=False, exit_code=42, termination_message=report(Reason.NUMERIC_FAULT)),
            ),
        )
    }
    plan = reconcile(s, first, 1, failed, NOW)
    assert [(c.index, c.precision, c.resume_from) for c in plan.create] == [(1, "bf16", f"{CHECKPOINT_MOUNT}/step-20")]
    assert plan.status.attempts[0].reason == "NumericFault" and plan.status.attempts[0].end_step == 30
    assert plan.status.last_checkpoint.step == 20
    assert plan.fallbacks == [("fp16", "bf16")]
    cond = next(c for c in plan.status.conditions if c.type == "PrecisionFallback")
    assert cond.status == "True" and cond.reason == "NumericFault"


def test_a_fallback_before_any_checkpoint_claims_none() -> None:
    s = spec(precision={"mode": "fp16"})
    first = reconcile(s, _status(), 1, {}, NOW).status
    fault = PodView(
        "p", 0, "Failed", alive=False, exit_code=42, termination_message=report(Reason.NUMERIC_FAULT, 5, None)
    )
    plan = reconcile(s, first, 1, {0: JobView(0, "Failed", pods=(fault,))}, NOW)
    assert [(c.precision, c.start_step, c.resume_from) for c in plan.create] == [("bf16", 0, None)]
    said = carried_out.said(s, plan, "PrecisionFallback", "AttemptStarted")
    assert said == ["fp16 -> bf16 after NumericFault, starting over: no checkpoint", "attempt 1 in bf16"]
    cond = next(c for c in plan.status.conditions if c.type == "PrecisionFallback")
    assert cond.message == "fp16 -> bf16, starting over: no checkpoint"


def test_the_next_attempt_waits_for_every_pod_of_the_failed_one() -> None:
    s = spec(precision={"mode": "fp16"}, workers=2)
    first = reconcile(s, _status(), 1, {}, NOW).status
    half = {
        0: JobView(
            0,
            finished="Failed",
            pods=(
                PodView("p0", 0, "Failed", alive=False, exit_code=42, termination_message=report(Reason.NUMERIC_FAULT)),
                PodView("p1", 1, "Running", alive=True, deleting=True),
            ),
        )
    }
    assert reconcile(s, first, 1, half, NOW).create == []


def test_an_attempt_ends_when_its_pods_say_so_before_the_job_controller_does() -> None:
    s = spec(precision={"mode": "fp16"})
    first = reconcile(s, _status(), 1, {}, NOW).status
    fault = PodView("p", 0, "Failed", alive=False, exit_code=42, termination_message=report(Reason.NUMERIC_FAULT))
    plan = reconcile(s, first, 1, {0: JobView(0, pods=(fault,))}, NOW)  # no Job condition yet
    assert [(c.index, c.precision) for c in plan.create] == [(1, "bf16")]
    assert plan.status.attempts[0].reason == "NumericFault"


@pytest.mark.parametrize(
    ("pods", "workers", "ended"),
    [
        ((PodView("p0", 0, "Succeeded", alive=False, exit_code=0),), 1, "Complete"),
        ((PodView("p0", 0, "Succeeded", alive=False, exit_code=0),), 2, None),  # rank 1 not seen yet
        (
            (PodView("p0", 0, "Succeeded", alive=False, exit_code=0), PodView("p1", 1, "Running", alive=True)),
            2,
            None,
        ),
        ((PodView("p0", 0, "Failed", alive=False, exit_code=1),), 2, "Failed"),  # backoffLimit 0
        ((PodView("p0", 0, "Failed", alive=False, exit_code=143, deleting=True),), 1, None),  # the Job's call
        ((PodView("p0", 0, "Failed", alive=False, platform_reason="Evicted"),), 1, "Failed"),
        ((), 1, None),
    ],
    ids=["all-ranks-done", "a-rank-missing", "a-rank-running", "one-failed", "deleted", "evicted", "no-pods"],
)
def test_which_pod_states_end_an_attempt(pods: tuple[PodView, ...], workers: int, ended: str | None) -> None:
    assert ended_by_pods(JobView(0, pods=pods), workers) == ended


def test_ttl_deletes_children_after_completion() -> None:
    s = spec(runPolicy={"ttlSecondsAfterFinished": 60})
    done = _status(
        phase="Succeeded",
        completionTime="2026-11-22T11:59:30Z",
        attempts=[{"index": 0, "precision": "bf16", "finishTime": "2026-11-22T11:58:00Z"}],
    )
    jobs = {0: JobView(0, finished="Complete")}
    assert reconcile(s, done, 1, jobs, NOW).delete == []
    assert reconcile(s, done, 1, jobs, NOW + timedelta(seconds=61)).delete == [0]


def test_suspend_stops_the_attempt_and_resume_starts_the_same_precision() -> None:
    running = reconcile(spec(precision={"mode": "bf16"}), _status(), 1, {}, NOW).status
    job = {0: JobView(0, pods=(PodView("p", 0, "Running", alive=True),))}
    suspended = reconcile(spec(precision={"mode": "bf16"}, runPolicy={"suspend": True}), running, 2, job, NOW)
    assert suspended.delete == [0] and suspended.status.phase == "Suspended"
    resumed = reconcile(spec(precision={"mode": "bf16"}), suspended.status, 3, {}, NOW)
    assert [(c.index, c.precision, c.resume_from) for c in resumed.create] == [(1, "bf16", None)]


def test_a_job_created_suspended_says_so_once_not_at_every_reconcile() -> None:
    held = spec(precision={"mode": "bf16"}, runPolicy={"suspend": True})
    first = reconcile(held, _status(), 1, {}, NOW)
    assert first.status.phase == "Suspended" and [e.reason for e in first.events] == ["Suspended"]
    for seconds in (5, 10):  # the ticker's reconciles, and a spec edit's
        later = reconcile(held, first.status, 1 + seconds // 5, {}, NOW + timedelta(seconds=seconds))
        assert later.status.phase == "Suspended" and later.events == []
        assert all(c.observed_generation == 1 + seconds // 5 for c in later.status.conditions if c.type == "Suspended")


def test_the_whole_job_deadline_fails_it() -> None:
    s = spec(runPolicy={"activeDeadlineSeconds": 10})
    first = reconcile(s, _status(), 1, {}, NOW).status
    plan = reconcile(s, first, 1, {0: JobView(0)}, NOW + timedelta(seconds=11))
    assert plan.status.phase == "Failed" and plan.delete == [0]


def test_each_new_attempt_gets_what_is_left_of_the_whole_job_deadline() -> None:
    s = spec(precision={"mode": "fp16"}, runPolicy={"activeDeadlineSeconds": 100})
    first = reconcile(s, _status(), 1, {}, NOW)
    assert first.deadline_seconds == 100
    ending = {0: JobView(0, "Failed", pods=(PodView("p", 0, "Failed", False, 42, report(Reason.NUMERIC_FAULT)),))}
    second = reconcile(s, first.status, 1, ending, NOW + timedelta(seconds=30))
    assert [c.precision for c in second.create] == ["bf16"] and second.deadline_seconds == 70
    assert reconcile(spec(), _status(), 1, {}, NOW).deadline_seconds is None


def test_a_succeeded_job_takes_its_final_step_and_loss_from_the_report() -> None:
    s = spec(precision={"mode": "bf16"})
    first = reconcile(s, _status(), 1, {}, NOW).status
    done = TerminationReport(
        reason=Reason.SUCCEEDED, step=60, precision="bf16", counters={"lossScale": 0.0, "loss": 1.25}
    ).to_message()
    job = {0: JobView(0, "Complete", pods=(PodView("p", 0, "Succeeded", False, 0, done),))}
    status = reconcile(s, first, 1, job, NOW).status
    assert (status.phase, status.step, status.loss, status.loss_scale) == ("Succeeded", 60, 1.25, None)


@pytest.mark.parametrize(("reported", "recorded"), [(0, 0), (10, 10), (None, 20)])
def test_an_attempt_records_the_step_its_trainer_really_started_from(reported: int | None, recorded: int) -> None:
    status = MixedPrecisionJobStatus(attempts=[AttemptStatus(index=1, precision="bf16", start_step=20)])
    done = TerminationReport(reason=Reason.SUCCEEDED, step=60, precision="bf16", start_step=reported)
    record_report(status, 1, done)
    assert status.attempts[0].start_step == recorded  # a fresh start replaces the plan; no word keeps it


def _attempt(index: int, precision: str, reason: str, repromoted: bool | None = None) -> AttemptStatus:
    return AttemptStatus(index=index, precision=precision, reason=reason, repromoted=repromoted)


def test_a_fallback_attempt_is_told_to_repromote_and_a_repromote_goes_one_rung_up() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 50})
    fault = classify(AttemptOutcome(42))
    history = [_attempt(0, "fp16", "NumericFault")]
    down = after_attempt(s, 0, "fp16", fault, 20, None, history=history)
    assert isinstance(down, StartAttempt) and (down.precision, down.repromote_after_steps) == ("bf16", 50)
    up = after_attempt(
        s,
        1,
        "bf16",
        classify(AttemptOutcome(47)),
        80,
        f"{CHECKPOINT_MOUNT}/step-80",
        history=[*history, _attempt(1, "bf16", "Repromote")],
    )
    assert isinstance(up, StartAttempt)
    assert (up.precision, up.promoted_from, up.start_step, up.resume_from) == (
        "fp16",
        "bf16",
        80,
        f"{CHECKPOINT_MOUNT}/step-80",
    )
    assert up.repromote_after_steps is None  # fp16 is the top of the ladder


def test_a_fallback_counts_its_clean_steps_from_the_step_the_attempt_before_it_faulted_at() -> None:
    """Resumed at step 20, the fallback runs steps 21..37 again before it passes the fault at 37:
    its launch says so, or it would go back up at 70 > 20 + 50 yet meet the trouble again on the way."""
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 50})
    faulted = AttemptStatus(index=0, precision="fp16", reason="NumericFault", end_step=37)
    down = after_attempt(
        s, 0, "fp16", classify(AttemptOutcome(42)), 20, f"{CHECKPOINT_MOUNT}/step-20", history=[faulted]
    )
    assert isinstance(down, StartAttempt) and (down.start_step, down.repromote_counts_from) == (20, 37)
    launch = attempt_launch(s, down, InPlacePlan(), job_name="j", namespace="n", checkpoint_dir=CHECKPOINT_MOUNT,
                            resume_from=down.resume_from)  # fmt: skip
    assert launch.to_env().count('"repromoteCountsFrom":37') == 1
    # No re-promotion (off, or fp32 below nothing to go up to): nothing to count, nothing in the launch.
    off = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 0})
    plain = after_attempt(off, 0, "fp16", classify(AttemptOutcome(42)), 20, None, history=[faulted])
    assert isinstance(plain, StartAttempt) and plain.repromote_counts_from is None
    unsaid = attempt_launch(off, plain, InPlacePlan(), job_name="j", namespace="n", checkpoint_dir=CHECKPOINT_MOUNT,
                            resume_from=None)  # fmt: skip
    assert "repromoteCountsFrom" not in unsaid.to_env()  # a trainer of the release before it reads it
    # A preemption's restart in the same precision counts on from what its checkpoint records.
    again = after_attempt(s, 0, "fp16", classify(AttemptOutcome(44)), 20, None, history=[faulted])
    assert isinstance(again, StartAttempt) and again.repromote_counts_from is None


def test_a_precision_that_faults_again_after_a_repromotion_is_not_tried_again() -> None:
    s = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 50})
    history = [
        _attempt(0, "fp16", "NumericFault"),
        _attempt(1, "bf16", "Repromote"),
        _attempt(2, "fp16", "NumericFault", repromoted=True),
    ]
    down = after_attempt(s, 2, "fp16", classify(AttemptOutcome(42)), 90, None, history=history)
    assert isinstance(down, StartAttempt) and down.precision == "bf16" and down.repromote_after_steps is None
    assert promotion_target(s, "bf16", history[:2]) == "fp16"  # before the second fault it was allowed


def test_an_attempt_is_told_to_repromote_only_when_an_attempt_is_left_to_go_up_in() -> None:
    # A Repromote ending uses one of runPolicy.maxAttempts: told to re-promote with none left
    # after it, a healthy attempt would end the job Failed (AttemptsExhausted) at its clean steps.
    history = [_attempt(0, "fp16", "NumericFault")]
    for attempts, told in ((2, None), (3, 50)):
        s = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 50},
                 runPolicy={"maxAttempts": attempts})  # fmt: skip
        down = after_attempt(s, 0, "fp16", classify(AttemptOutcome(42)), 20, None, history=history, used=1)
        assert isinstance(down, StartAttempt) and (down.precision, down.repromote_after_steps) == ("bf16", told)


@pytest.mark.parametrize(
    ("precision", "history"),
    [
        ({"mode": "fp16", "fallback": ["bf16"]}, [_attempt(0, "fp16", "NumericFault")]),  # re-promotion off
        (  # precision.maxRepromotions used
            {"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 5, "maxRepromotions": 1},
            [
                _attempt(0, "fp16", "NumericFault"),
                _attempt(1, "bf16", "Repromote"),
                _attempt(2, "fp16", "NumericFault", True),
            ],
        ),
    ],
)
def test_an_exit_47_of_an_attempt_never_told_to_repromote_does_not_go_up(
    precision: dict[str, object], history: list[AttemptStatus]
) -> None:
    """A script's own sys.exit(47) reads as Repromote: only an attempt the planner told to
    re-promote (`promotion_target`) goes up; another goes on in its precision, from its checkpoint."""
    s = spec(precision=precision)
    assert promotion_target(s, "bf16", history) is None  # so the planner never told it to
    ended = len(history)
    path = f"{CHECKPOINT_MOUNT}/step-80"
    history = [*history, _attempt(ended, "bf16", "Repromote")]
    nxt = after_attempt(s, ended, "bf16", classify(AttemptOutcome(47)), 80, path, history=history)
    assert isinstance(nxt, StartAttempt)
    assert (nxt.precision, nxt.promoted_from, nxt.start_step, nxt.resume_from) == ("bf16", None, 80, path)


def test_a_repromoted_attempt_counts_itself_against_max_repromotions() -> None:
    """With precision.maxRepromotions 1, the attempt a re-promotion starts is that one: it is not
    told to re-promote again (its exit 47 would not go up)."""
    s = spec(precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 5, "maxRepromotions": 1})
    history = [
        _attempt(0, "fp16", "NumericFault"),
        _attempt(1, "bf16", "NumericFault"),
        _attempt(2, "fp32", "Repromote"),
    ]
    up = after_attempt(s, 2, "fp32", classify(AttemptOutcome(47)), 80, None, history=history)
    assert isinstance(up, StartAttempt) and (up.precision, up.promoted_from) == ("bf16", "fp32")
    assert up.repromote_after_steps is None


def test_a_repromotion_ends_its_attempt_with_a_normal_event() -> None:
    """A re-promotion is the job getting better: no Warning (those ask someone to look)."""
    s = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 10})
    status = reconcile(s, _status(), 1, {}, NOW).status
    for index, code, reason in ((0, 42, Reason.NUMERIC_FAULT), (1, 47, Reason.REPROMOTE)):
        pod = PodView("p", 0, "Failed", alive=False, exit_code=code, termination_message=report(reason, 40, 40))
        plan = reconcile(s, status, 1, {index: JobView(index, "Failed", pods=(pod,))}, NOW)
        status = plan.status
    ended = [(e.type, e.message.split(":")[0]) for e in plan.events if e.reason == "AttemptEnded"]
    assert ended == [("Normal", "attempt 1 (bf16) ended Repromote")]
    assert [a.precision for a in status.attempts] == ["fp16", "bf16", "fp16"]


def test_repromotions_are_bounded_and_off_by_default() -> None:
    off = spec(precision={"mode": "fp16", "fallback": ["bf16"]})
    assert promotion_target(off, "bf16", []) is None
    bounded = spec(precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 5, "maxRepromotions": 1})
    promoted = [
        _attempt(0, "fp16", "NumericFault"),
        _attempt(1, "bf16", "Repromote"),
        _attempt(2, "fp16", "Preempted", True),
    ]
    assert promotion_target(bounded, "bf16", promoted[:2]) == "fp16"
    assert promotion_target(bounded, "bf16", promoted) is None


def test_an_auto_attempt_that_measured_a_precision_off_the_capability_ladder_still_falls_back() -> None:
    s = spec(resources={"gpusPerWorker": 1, "minComputeCapability": "8.0"})  # ladder [bf16, fp32]
    nxt = after_attempt(s, 0, "fp16", classify(AttemptOutcome(42)), 10, None)  # measured fp16 on the node
    assert isinstance(nxt, StartAttempt) and (nxt.precision, nxt.fallback_from) == ("bf16", "fp16")
