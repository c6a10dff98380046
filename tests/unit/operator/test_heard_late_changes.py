"""A change in place the trainer made after the operator's last read of an attempt that the
operator then ended on its own word (runPolicy.suspend, a stall, a resize, the deadline, a node
lost): the termination report its pods leave once they stop (`cutoff.heard`) lists it. The change is
recorded as a read would have recorded it (the attempt ends as its fault ended it, the next one
begins in place in the precision it went on in) and the operator's ending moves to that attempt;
the attempt that follows, if one was planned, goes on in that precision, numbered after it.
Ignored, the job resumed in the precision that had faulted, and its history lacked an attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning import history
from mpjob.planning import status as st
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import CheckpointRef, InPlaceChange, TerminationReport
from tests.unit.operator.cases import CLAIM
from tests.unit.operator.test_lost_nodes import nodes, on_nodes, running

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
FALLBACK = InPlaceChange.model_validate(
    {"kind": "fallback", "attempt": 1, "step": 50, "startStep": 40, "fromPrecision": "fp16",
     "toPrecision": "bf16", "rule": "MaxNonFiniteLosses", "message": "MaxNonFiniteLosses: 5 non-finite losses",
     "recoverySeconds": 0.5, "at": (NOW - timedelta(seconds=20)).timestamp()}
)  # fmt: skip


def spec(**over: object) -> MixedPrecisionJobSpec:
    doc = {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]}, "checkpoint": CLAIM}
    return MixedPrecisionJobSpec.model_validate({**doc, **over})


def alive() -> dict[int, JobView]:
    started = (NOW - timedelta(seconds=100)).isoformat()
    return {0: JobView(0, pods=(PodView("j-a0-0", 0, "Running", True, uid="u0", started_at=started),))}


def started(s: MixedPrecisionJobSpec) -> MixedPrecisionJobStatus:
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW - timedelta(seconds=100)).status
    status = reconcile(s, first, 1, alive(), NOW - timedelta(seconds=90)).status
    status.step = 45  # the last live reading: before the change
    status.attempts[0].progress_time = (NOW - timedelta(seconds=80)).isoformat()  # which showed the attempt
    return status


def stopped(changes: list[InPlaceChange]) -> dict[int, JobView]:
    """Attempt 0's Job, gone: its pod stopped on SIGTERM at step 87 in bf16, its checkpoint written there."""
    ckpt = CheckpointRef(step=87, path="/ck/step-000000087", sha256="ab", precision="bf16")
    said = TerminationReport(
        reason=Reason.PREEMPTED, step=87, start_step=40 if changes else 0, precision="bf16" if changes else "fp16",
        last_good_checkpoint=ckpt, precision_changes=changes,
    )  # fmt: skip
    pod = PodView("j-a0-0", 0, "Failed", False, exit_code=ExitCode.PREEMPTED, termination_message=said.to_message())
    return {0: JobView(0, pods=(pod,))}


def test_a_suspended_attempts_late_fallback_is_recorded_and_the_job_resumes_in_its_precision() -> None:
    s = spec()
    suspended = s.model_copy(update={"run_policy": s.run_policy.model_copy(update={"suspend": True})})
    written = reconcile(suspended, started(s), 2, alive(), NOW).status
    assert [(a.reason, a.end_step) for a in written.attempts] == [(Reason.SUSPENDED, 45)]
    plan = reconcile(suspended, written, 2, {}, NOW + timedelta(seconds=5), stopped=stopped([FALLBACK]))
    heard = plan.status
    first, second = heard.attempts
    assert (first.precision, first.reason, first.end_step) == ("fp16", Reason.NUMERIC_FAULT, 50)
    assert first.message.startswith("MaxNonFiniteLosses")
    assert (second.index, second.precision, second.in_place, second.start_step) == (1, "bf16", True, 40)
    ended_at = written.attempts[0].finish_time
    assert (second.reason, second.end_step, second.finish_time) == (Reason.SUSPENDED, 87, ended_at)
    assert second.message == written.attempts[0].message and second.charged is False
    assert (heard.phase, heard.attempt, heard.precision, heard.step) == ("Suspended", 1, "bf16", 87)
    running = next(c for c in heard.conditions if c.type == "Running")
    assert (running.status, running.reason) == ("False", "Suspended")
    counts = history.counts(heard)
    assert (counts.started, counts.by_reason) == (2, {Reason.NUMERIC_FAULT: 1, Reason.SUSPENDED: 1})
    assert plan.fallbacks == [("fp16", "bf16")] and plan.create == []
    resumed = reconcile(s, heard, 3, {}, NOW + timedelta(seconds=10), stopped=stopped([FALLBACK]))
    assert [(c.index, c.precision, c.start_step) for c in resumed.create] == [(2, "bf16", 87)]
    assert len(resumed.status.attempts) == 3  # heard once: read again, the report adds nothing


def test_a_stalled_attempts_late_fallback_moves_the_planned_attempt_after_it_in_its_precision() -> None:
    s = spec(runPolicy={"progressDeadlineSeconds": 60})
    status = started(s)
    status.attempts[0].progress_time = st.stamp(NOW - timedelta(seconds=61))
    cut = reconcile(s, status, 1, alive(), NOW).status
    assert [(a.index, a.precision, a.reason) for a in cut.attempts] == [(0, "fp16", "Stalled"), (1, "fp16", None)]
    plan = reconcile(s, cut, 1, {}, NOW + timedelta(seconds=5), stopped=stopped([FALLBACK]))
    ended, in_place, planned = plan.status.attempts
    assert (ended.reason, ended.end_step, in_place.in_place, in_place.precision) == ("NumericFault", 50, True, "bf16")
    assert (in_place.index, in_place.reason, in_place.end_step) == (1, "Stalled", 87)
    assert (planned.index, planned.precision, planned.start_step, planned.finish_time) == (2, "bf16", 87, None)
    due = reconcile(s, plan.status, 1, {}, NOW + timedelta(seconds=15), stopped=stopped([FALLBACK]))
    assert [(c.index, c.precision, c.start_step) for c in due.create] == [(2, "bf16", 87)]  # after its backoff
    assert (plan.status.attempt, plan.status.precision, history.next_index(plan.status)) == (2, "bf16", 3)
    assert history.job_index(plan.status, 1) == 0  # it ran in attempt 0's Job


def test_a_report_that_lists_only_recorded_changes_leaves_the_ending_as_it_was() -> None:
    s = spec()
    suspended = s.model_copy(update={"run_policy": s.run_policy.model_copy(update={"suspend": True})})
    written = reconcile(suspended, started(s), 2, alive(), NOW).status
    heard = reconcile(suspended, written, 2, {}, NOW + timedelta(seconds=5), stopped=stopped([])).status
    (only,) = heard.attempts
    assert (only.precision, only.reason, only.end_step) == ("fp16", Reason.SUSPENDED, 87)
    foreign = FALLBACK.model_copy(update={"from_precision": "bf16", "to_precision": "fp32"})
    other = reconcile(suspended, written, 2, {}, NOW + timedelta(seconds=5), stopped=stopped([foreign])).status
    assert [(a.precision, a.reason) for a in other.attempts] == [("fp16", Reason.SUSPENDED)]  # not this attempt's


def test_an_attempt_past_the_deadline_ends_in_place_where_its_late_fallback_went_on() -> None:
    s = spec(runPolicy={"activeDeadlineSeconds": 60})
    status = started(s)
    status.start_time = st.stamp(NOW - timedelta(seconds=61))
    failed = reconcile(s, status, 1, alive(), NOW).status
    assert (failed.phase, [a.reason for a in failed.attempts]) == ("Failed", [Reason.DEADLINE_EXCEEDED])
    heard = reconcile(s, failed, 1, {}, NOW + timedelta(seconds=5), stopped=stopped([FALLBACK])).status
    assert [(a.precision, a.reason, a.end_step) for a in heard.attempts] == [
        ("fp16", Reason.NUMERIC_FAULT, 50),
        ("bf16", Reason.DEADLINE_EXCEEDED, 87),
    ]
    assert (heard.phase, heard.message, heard.completion_time) == ("Failed", failed.message, failed.completion_time)
    assert heard.last_checkpoint is not None and heard.last_checkpoint.step == 87


def test_a_late_fallback_that_needs_an_attempt_the_job_no_longer_has_ends_the_job_at_its_fault() -> None:
    s = spec(runPolicy={"maxAttempts": 1})
    suspended = s.model_copy(update={"run_policy": s.run_policy.model_copy(update={"suspend": True})})
    written = reconcile(suspended, started(s), 2, alive(), NOW).status
    heard = reconcile(suspended, written, 2, {}, NOW + timedelta(seconds=5), stopped=stopped([FALLBACK])).status
    (only,) = heard.attempts
    assert (only.reason, only.end_step, heard.phase) == (Reason.NUMERIC_FAULT, 50, "Failed")
    assert heard.last_checkpoint is not None and heard.last_checkpoint.step == 87  # what it wrote, told


def test_a_late_fallback_that_only_the_peers_of_a_lost_node_report_moves_the_next_attempt_to_its_precision() -> None:
    """Rank 0's node stops answering while rank 1 runs: the attempt ends NodeLost at once, rank 1
    cut. Its report (its collective failed on the lost peer within the cut's grace) lists the
    fallback the ranks made after the last read; the lost pod, which explains the ending, has none."""
    s, status = running(2, precision={"mode": "fp16", "fallback": ["bf16", "fp32"]})
    status.attempts[0].precision = status.precision = "fp16"
    lost = on_nodes(PodView("j-a0-0", 0, "Running", True, node="n0"), nodes("n1"))
    peer = PodView("j-a0-1", 1, "Running", True, node="n1")
    cut = reconcile(s, status, 1, {0: JobView(0, pods=(lost, peer))}, NOW).status
    assert [(a.reason, a.precision) for a in cut.attempts] == [(Reason.NODE_LOST, "fp16"), (None, "fp16")]
    said = TerminationReport(
        reason=Reason.INFRA_ERROR, step=52, start_step=40, precision="bf16", precision_changes=[FALLBACK]
    )
    peer = PodView("j-a0-1", 1, "Failed", False, exit_code=ExitCode.INFRA_ERROR, termination_message=said.to_message())
    gone = {0: JobView(0, pods=(lost, peer))}
    plan = reconcile(s, cut, 1, {}, NOW + timedelta(seconds=5), stopped=gone)
    assert [(a.index, a.precision, a.reason) for a in plan.status.attempts] == [
        (0, "fp16", Reason.NUMERIC_FAULT),
        (1, "bf16", Reason.NODE_LOST),
        (2, "bf16", None),
    ]
    assert (plan.status.attempts[1].charged, plan.status.attempts[1].end_step, plan.fallbacks) == (
        False, 52, [("fp16", "bf16")],
    )  # fmt: skip
    again = reconcile(s, plan.status, 1, {}, NOW + timedelta(seconds=60), stopped=gone)
    assert (len(again.status.attempts), again.fallbacks) == (3, [])  # heard once
    assert [(c.index, c.precision) for c in again.create] == [(2, "bf16")]
    silent = reconcile(s, cut, 1, {}, NOW + timedelta(seconds=5), stopped={0: JobView(0, pods=(lost,))}).status
    assert [(a.reason, a.precision) for a in silent.attempts] == [(Reason.NODE_LOST, "fp16"), (None, "fp16")]
