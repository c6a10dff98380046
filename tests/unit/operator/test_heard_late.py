"""The checkpoint a trainer writes on SIGTERM when runPolicy.activeDeadlineSeconds or a stall
(runPolicy.progressDeadlineSeconds) ends its attempt: the ending is written at once, at the step
last seen; once the pods have stopped, the step and checkpoint their report names are the
attempt's endStep and the job's step and lastCheckpoint, also when the job has finished (a
user who raises the deadline and resumes, or who reads the status for the last checkpoint, is
told of the newest one), and the next attempt after a stall resumes from it."""

from __future__ import annotations

from datetime import timedelta

import pytest

from mpjob.planning import status as st
from mpjob.planning.endings import JobView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.codes import Reason
from tests.unit.operator.test_cutoff import NOW, stopped_at
from tests.unit.operator.test_lost_nodes import running
from tests.unit.operator.test_progress_deadline import RUNNING

pytestmark = pytest.mark.unit


def test_an_attempt_past_the_active_deadline_ends_at_the_checkpoint_its_trainer_reports() -> None:
    spec, status = running(1, runPolicy={"activeDeadlineSeconds": 60})
    status.start_time, status.step = st.stamp(NOW - timedelta(seconds=61)), 40
    status.attempts[0].progress_time = st.stamp(NOW - timedelta(seconds=5))  # the live reading of step 40
    plan = reconcile(spec, status, 1, RUNNING, NOW)
    assert (plan.status.phase, plan.delete, plan.status.attempts[0].end_step) == ("Failed", [0], 40)
    waiting = reconcile(spec, plan.status, 1, {}, NOW, lingering=frozenset({0})).status
    assert (waiting.step, waiting.last_checkpoint.step if waiting.last_checkpoint else None) == (40, 20)
    heard = reconcile(spec, waiting, 1, {}, NOW + timedelta(seconds=5), stopped={0: stopped_at(87)})
    (attempt,) = heard.status.attempts
    assert heard.status.last_checkpoint is not None and heard.status.last_checkpoint.step == 87
    assert (attempt.reason, attempt.end_step, heard.status.step) == (Reason.DEADLINE_EXCEEDED, 87, 87)
    assert (heard.status.phase, heard.create) == ("Failed", [])
    silent = reconcile(spec, waiting, 1, {}, NOW, stopped={0: stopped_at(87, reported=False)}).status
    assert (silent.attempts[0].end_step, silent.step, silent.last_checkpoint) == (40, 40, waiting.last_checkpoint)


def test_a_job_failed_at_its_own_deadline_keeps_the_checkpoint_its_pods_report() -> None:
    spec, status = running(1, runPolicy={"activeDeadlineSeconds": 600})
    status.start_time, status.step = st.stamp(NOW - timedelta(seconds=30)), 40
    failed = JobView(0, "Failed", "DeadlineExceeded", pods=stopped_at(87).pods)  # the Job controller's deadline
    plan = reconcile(spec, status, 1, {0: failed}, NOW)
    (attempt,) = plan.status.attempts
    assert plan.status.phase == "Failed" and attempt.reason == Reason.DEADLINE_EXCEEDED
    assert attempt.message == "the attempt ran past runPolicy.activeDeadlineSeconds"  # not the trainer's SIGTERM
    assert plan.status.last_checkpoint is not None and plan.status.last_checkpoint.step == 87
    assert (attempt.end_step, plan.status.step) == (87, 87)


def test_a_stalled_attempt_s_sigterm_checkpoint_is_where_the_next_attempt_resumes() -> None:
    spec, status = running(1, runPolicy={"progressDeadlineSeconds": 60})
    status.step = 40
    status.attempts[0].progress_time = st.stamp(NOW - timedelta(seconds=61))
    plan = reconcile(spec, status, 1, RUNNING, NOW)
    assert [a.reason for a in plan.status.attempts] == [Reason.STALLED, None] and plan.create == []
    assert plan.status.attempts[1].start_step == 20  # all that is known while its pods stop
    heard = reconcile(spec, plan.status, 1, {}, NOW + timedelta(seconds=5), stopped={0: stopped_at(47)})
    assert (heard.status.attempts[0].end_step, heard.status.step) == (47, 47)
    assert heard.status.last_checkpoint is not None and heard.status.last_checkpoint.step == 47
    assert [a.start_step for a in heard.create] == [47] and heard.status.attempts[1].start_step == 47
