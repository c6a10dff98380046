"""Which attempts are cut (mpjob.planning.cutoff): when a rank crashed, was lost or hangs, the
ranks still alive cannot checkpoint on SIGTERM, so their pods are deleted with CUT_GRACE_SECONDS
instead of waiting out their own grace period; a stop the ranks agreed on is never cut short."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from mpjob.controller.lostnodes import on_nodes
from mpjob.controller.records import pod_view
from mpjob.planning import cutoff
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import CheckpointRef, Counters, TerminationReport
from tests.unit.operator.test_cache import pod
from tests.unit.operator.test_lost_nodes import nodes, running

pytestmark = pytest.mark.unit

ALIVE = PodView("j-a0-0", 0, "Running", True, uid="u0", node="n0")


def ended(code: int) -> PodView:
    return PodView("j-a0-1", 1, "Failed" if code else "Succeeded", False, exit_code=code, uid="u1", node="n1")


@pytest.mark.parametrize("code", [ExitCode.INFRA_ERROR, ExitCode.NUMERIC_FAULT, ExitCode.OUT_OF_DEVICE_MEMORY, 137])
@pytest.mark.parametrize("finished", [None, "Failed"])  # seen before the Job controller fails the Job, or after
def test_a_rank_that_crashed_beside_live_peers_gets_them_cut_and_its_job_kept(code: int, finished: str | None) -> None:
    spec, status = running(2)
    plan = reconcile(spec, status, 1, {0: JobView(0, finished=finished, pods=(ALIVE, ended(code)))}, datetime.now(UTC))
    assert (plan.cut, plan.delete, plan.create) == ([0], [], [])  # the Job stays for its logs
    assert len(plan.status.attempts) == 1  # it ends once rank 0's pod has stopped, as before


def test_a_job_its_queue_suspended_is_left_to_its_queue() -> None:
    spec, status = running(2)
    job = JobView(0, pods=(ALIVE, ended(137)), suspended=True)
    assert reconcile(spec, status, 1, {0: job}, datetime.now(UTC)).cut == []


@pytest.mark.parametrize("code", [ExitCode.PREEMPTED, ExitCode.REPROMOTE])
def test_a_stop_the_ranks_agreed_on_keeps_the_grace_to_checkpoint(code: int) -> None:
    spec, status = running(2)
    plan = reconcile(spec, status, 1, {0: JobView(0, finished="Failed", pods=(ALIVE, ended(code)))}, datetime.now(UTC))
    assert (plan.cut, plan.delete, len(plan.status.attempts)) == ([], [], 1)


def test_only_live_pods_not_yet_deleted_that_briefly_are_cut() -> None:
    going = [PodView(f"p{g}", 0, "Running", True, uid=f"u{g}", grace=g) for g in (None, 60, 10, 0)]
    gone = PodView("p-ended", 1, "Failed", False, exit_code=1, uid="u-ended")
    assert [p.name for p in cutoff.to_cut(JobView(0, pods=(*going, gone)))] == ["pNone", "p60"]


def test_the_pod_view_carries_the_uid_and_the_grace_it_is_deleted_with() -> None:
    body = pod(0)
    assert (pod_view(body).uid, pod_view(body).grace) == ("pod-0", None)
    body["metadata"] |= {"deletionTimestamp": "2026-12-01T00:00:00Z", "deletionGracePeriodSeconds": 60}
    assert (pod_view(body).deleting, pod_view(body).grace) == (True, 60)


def test_the_cut_is_said_in_an_event_naming_the_pods() -> None:
    event = cutoff.cut_event([ALIVE, PodView("j-a0-2", 2, "Running", True, uid="u2")])
    assert (event.type, event.reason) == ("Normal", "RanksCut")
    assert event.message.startswith(f"j-a0-0, j-a0-2 deleted with a {cutoff.CUT_GRACE_SECONDS}-s grace: "), event


def test_an_ending_whose_job_was_never_deleted_is_carried_out_after_a_restart() -> None:
    """The operator wrote a NodeLost ending, then stopped before deleting the Job: the next
    reconcile deletes it and cuts its ranks (before, the next attempt waited for them for good)."""
    spec, status = running(2)
    blocked = PodView("j-a0-0", 0, "Running", True, node="n0", uid="u0")
    lost = on_nodes(PodView("j-a0-1", 1, "Running", True, node="n1", uid="u1"), nodes("n0"))
    jobs = {0: JobView(0, pods=(blocked, lost))}
    written = reconcile(spec, status, 1, jobs, datetime.now(UTC)).status
    assert [a.reason for a in written.attempts] == ["NodeLost", None]
    again = reconcile(spec, written, 1, {0: JobView(0, pods=(blocked,))}, datetime.now(UTC))
    assert (again.delete, again.cut, again.create) == ([0], [0], [])


def test_a_suspension_whose_job_was_never_deleted_is_carried_out_with_the_full_grace() -> None:
    spec, status = running(1)
    suspended = spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})
    jobs = {0: JobView(0, pods=(ALIVE,))}
    written = reconcile(suspended, status, 1, jobs, datetime.now(UTC)).status
    assert written.phase == "Suspended"
    again = reconcile(suspended, written, 1, jobs, datetime.now(UTC))
    assert (again.delete, again.cut) == ([0], [])  # SIGTERM: its trainer checkpoints


def test_a_job_that_finished_or_that_the_attempt_runs_in_is_not_swept() -> None:
    spec, status = running(2)
    written = reconcile(spec, status, 1, {0: JobView(0, pods=(ALIVE, ended(1)))}, datetime.now(UTC)).status
    assert written.attempts[-1].finish_time is None  # rank 0 still stops: the attempt runs on
    failed = {0: JobView(0, finished="Failed", pods=(ALIVE, ended(1)))}
    assert reconcile(spec, written, 1, failed, datetime.now(UTC)).delete == []


def _suspending(spec: MixedPrecisionJobSpec) -> MixedPrecisionJobSpec:
    return spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})


def test_a_suspension_whose_job_waits_in_its_queue_deletes_that_job_after_a_restart() -> None:
    """runPolicy.suspend ends an attempt whose Job waits suspended in its queue (no pods yet); the
    operator stops before deleting the Job. The next reconcile deletes it: left there, the queue
    could admit it once the job is resumed and its next attempt runs, two trainers writing
    checkpoints at once (it stayed until `_retire` reached it, two attempts later)."""
    spec, status = running(1)
    status.phase = "Pending"  # queued: Kueue has not admitted attempt 0's Job
    stopped = _suspending(spec)
    queued = {0: JobView(0, suspended=True)}
    written = reconcile(stopped, status, 1, queued, datetime.now(UTC))
    assert (written.status.phase, written.delete) == ("Suspended", [0])
    again = reconcile(stopped, written.status, 1, queued, datetime.now(UTC))  # the delete never happened
    assert (again.delete, again.cut, again.create) == ([0], [], [])
    resumed = reconcile(spec, written.status, 1, queued, datetime.now(UTC))
    assert resumed.delete == [0] and [c.index for c in resumed.create] == [1]


def test_a_queued_shrink_whose_job_was_never_deleted_is_carried_out_after_a_restart() -> None:
    job = MixedPrecisionJobSpec.model_validate(
        {
            "workers": 3,
            "task": {"builtin": "mlp"},
            "training": {"batchSize": 4},
            "elastic": {"minWorkers": 1, "waitSeconds": 30},
            "resources": {"gpusPerWorker": 1},
            "runPolicy": {"queueName": "team-a"},
        }
    )
    start = datetime.now(UTC)
    status = reconcile(job, MixedPrecisionJobStatus(), 1, {}, start).status
    held = {0: JobView(0, suspended=True, queue_message="insufficient quota", quota_short=True)}
    shrunk = reconcile(job, status, 1, held, start + timedelta(seconds=40), fits=2)
    assert shrunk.delete == [0] and [a.reason for a in shrunk.status.attempts] == ["ScaledDown", None]
    again = reconcile(job, shrunk.status, 1, held, start + timedelta(seconds=41), fits=2)
    assert again.delete == [0] and [c.workers for c in again.create] == [2]


def test_a_job_its_queue_suspended_while_its_attempt_runs_is_not_swept() -> None:
    """Kueue preempting the running attempt: its Job waits for readmission, the same attempt."""
    spec, status = running(2)
    preempted = JobView(0, pods=(PodView("j-a0-0", 0, "Running", True, uid="u0", deleting=True),), suspended=True)
    plan = reconcile(spec, status, 1, {0: preempted}, datetime.now(UTC))
    assert (plan.delete, plan.cut, len(plan.status.attempts)) == ([], [], 1)
    failed = JobView(0, "Failed", "BackoffLimitExceeded", suspended=True)  # preempted for good: it ends Preempted
    ended = reconcile(spec, plan.status, 1, {0: failed}, datetime.now(UTC))
    assert [a.reason for a in ended.status.attempts] == ["Preempted", None] and ended.delete == []


NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def stopped_at(step: int, attempt: int = 0, *, reported: bool = True) -> JobView:
    """Attempt `attempt`'s Job as kept once gone: its pod stopped after SIGTERM, reporting (or not)
    the checkpoint it wrote at `step`."""
    ckpt = CheckpointRef(step=step, path=f"/ck/step-{step:09d}", sha256="ab", precision="bf16")
    said = TerminationReport(reason=Reason.PREEMPTED, step=step, precision="bf16", last_good_checkpoint=ckpt)
    message = said.to_message() if reported else None
    pod = PodView(f"j-a{attempt}-0", 0, "Failed", False, exit_code=ExitCode.PREEMPTED, termination_message=message)
    return JobView(attempt, pods=(pod,))


def test_a_suspended_attempt_ends_where_its_trainer_stopped_and_the_next_resumes_there() -> None:
    spec, status = running(1)
    status.step = 40  # the last live reading; the trainer goes on to step 87 before it stops
    status.attempts[0].progress_time = NOW.isoformat()  # which showed the attempt
    suspended = spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})
    written = reconcile(suspended, status, 1, {0: JobView(0, pods=(ALIVE,))}, NOW).status
    assert written.attempts[0].end_step == 40  # all that is known while its pod stops
    waiting = reconcile(suspended, written, 1, {}, NOW, lingering=frozenset({0})).status
    silent = reconcile(suspended, waiting, 1, {}, NOW, stopped={0: stopped_at(87, reported=False)}).status
    assert (silent.attempts[0].end_step, silent.last_checkpoint, silent.step) == (40, status.last_checkpoint, 40)
    heard = reconcile(suspended, waiting, 1, {}, NOW, stopped={0: stopped_at(87)}).status
    assert heard.last_checkpoint is not None and heard.phase == "Suspended"
    assert (heard.attempts[0].end_step, heard.last_checkpoint.step, heard.step) == (87, 87, 87)
    resumed = reconcile(spec, heard, 2, {}, NOW + timedelta(seconds=1), stopped={0: stopped_at(87)})
    assert [a.start_step for a in resumed.create] == [87] and resumed.status.attempts[1].start_step == 87
    # Suspended again before its trainer said anything: it trained nothing, and nothing was wasted.
    again = reconcile(suspended, resumed.status, 3, {1: JobView(1)}, NOW + timedelta(seconds=2)).status
    assert [(a.start_step, a.end_step) for a in again.attempts] == [(0, 87), (87, 87)]
    assert again.cost is not None and again.cost.wasted_steps == 0


def test_the_attempt_resumed_after_a_suspension_shows_none_of_the_suspended_ones_figures() -> None:
    """Live figures are each attempt's own: the resumed attempt has none before its first reading.
    A reconcile before its Job was made (its create failed, or the operator restarted after
    writing the status) read the suspended attempt's report again and showed its loss, loss
    scale and overflow count as the waiting attempt's."""
    spec, status = running(1)
    suspended = spec.model_copy(update={"run_policy": spec.run_policy.model_copy(update={"suspend": True})})
    written = reconcile(suspended, status, 1, {0: JobView(0, pods=(ALIVE,))}, NOW).status
    counters = Counters(overflowSteps=3, lossScale=1024.0, loss=2.5)
    said = TerminationReport.model_validate_json(stopped_at(87).pods[0].termination_message or "")
    said = said.model_copy(update={"precision": "fp16", "counters": counters})
    gone = {0: JobView(0, pods=(replace(stopped_at(87).pods[0], termination_message=said.to_message()),))}
    heard = reconcile(suspended, written, 1, {}, NOW, stopped=gone).status
    assert (heard.loss, heard.loss_scale, heard.overflow_steps) == (2.5, 1024.0, 3)  # the suspended job's last
    resumed = reconcile(spec, heard, 2, {}, NOW + timedelta(seconds=1), stopped=gone)
    again = reconcile(spec, resumed.status, 2, {}, NOW + timedelta(seconds=2), stopped=gone)
    for plan in (resumed, again):
        assert [c.index for c in plan.create] == [1]
        assert (plan.status.loss, plan.status.loss_scale, plan.status.overflow_steps) == (None, None, None)
    assert again.status == resumed.status


def test_a_resized_attempt_s_report_moves_the_next_attempt_s_start_until_that_one_has_a_job() -> None:
    spec, status = running(2)
    status.step = 40
    status.attempts[0] = status.attempts[0].model_copy(
        update={"reason": Reason.SCALED_DOWN.value, "end_step": 40, "finish_time": "2026-12-01T11:59:00Z"}
    )
    status.attempts.append(status.attempts[0].model_copy(update={"index": 1, "start_step": 20, "world_size": 1}))
    status.attempts[1] = status.attempts[1].model_copy(update={"reason": None, "end_step": None, "finish_time": None})
    status.attempt, status.phase = 1, "Pending"
    plan = reconcile(spec, status, 1, {}, NOW, stopped={0: stopped_at(50)})
    assert (plan.status.attempts[0].end_step, [a.start_step for a in plan.create]) == (50, [50])
    created = reconcile(spec, status, 1, {1: JobView(1)}, NOW, stopped={0: stopped_at(50)}).status
    assert (created.attempts[0].end_step, created.attempts[1].start_step, created.step) == (40, 20, 40)


@pytest.mark.parametrize("seen", ["lost pod seen", "lost pod gone"])
def test_a_shrink_for_a_lost_node_whose_job_was_never_deleted_is_cut_after_a_restart(seen: str) -> None:
    """An elastic job shrinks at once when a rank's node goes: its peers, blocked on the lost rank,
    are cut. An operator that stopped between writing the ScaledDown ending and deleting the Job
    cuts them when it carries the deletion out, as it does a NodeLost ending's; a shrink for pods
    the scheduler found no node for keeps the full grace (its ranks are whole and checkpoint)."""
    spec, status = running(3, elastic={"minWorkers": 2, "waitSeconds": 600})
    blocked = tuple(PodView(f"j-a0-{i}", i, "Running", True, node=f"n{i}", uid=f"u{i}") for i in (0, 1))
    lost = on_nodes(PodView("j-a0-2", 2, "Running", True, node="n2", uid="u2"), nodes("n0", "n1"))
    written = reconcile(spec, status, 1, {0: JobView(0, pods=(*blocked, lost))}, datetime.now(UTC))
    assert [a.reason for a in written.status.attempts] == [Reason.SCALED_DOWN, None] and written.cut == [0]
    left = (*blocked, lost) if seen == "lost pod seen" else blocked
    again = reconcile(spec, written.status, 1, {0: JobView(0, pods=left)}, datetime.now(UTC))
    assert (again.delete, again.cut, again.create) == ([0], [0], [])
    since = (datetime.now(UTC) - timedelta(seconds=700)).strftime("%Y-%m-%dT%H:%M:%SZ")
    waiting = PodView("j-a0-2", 2, "Pending", True, uid="u2", unschedulable_since=since)
    shrunk = reconcile(spec, status, 1, {0: JobView(0, pods=(*blocked, waiting))}, datetime.now(UTC))
    assert [a.reason for a in shrunk.status.attempts] == [Reason.SCALED_DOWN, None] and shrunk.cut == []
    swept = reconcile(spec, shrunk.status, 1, {0: JobView(0, pods=blocked)}, datetime.now(UTC))
    assert (swept.delete, swept.cut) == ([0], [])
