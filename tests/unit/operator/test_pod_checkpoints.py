"""Checkpoints kept in the pod (the default or an explicit emptyDir, no bucket) go with its pods:
an attempt in a new Job (a fallback through a restart, a resume after a suspension, a preemption)
is planned from step 0 and says why, instead of claiming a checkpoint it cannot reach. A change
in place (the same processes) and `mpjob run` (a folder on disk) still resume from theirs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun.stops import Stop
from mpjob.planning import status as st
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.lifecycle import Plan
from mpjob.planning.planner import StartAttempt
from mpjob.planning.reconcile import outcome_of, reconcile
from mpjob.planning.resumepoint import POD_CHECKPOINTS
from mpjob.planning.status import ConditionType
from mpjob.summary import summary_lines
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, InPlaceChange, TerminationReport
from tests.unit.operator import carried_out
from tests.unit.operator import test_cutoff as cutoff_tests
from tests.unit.operator import test_lost_nodes as lost_nodes
from tests.unit.operator.cases import CLAIM, S3
from tests.unit.operator.test_one_lifecycle import (
    FAULT,
    OK,
    PREEMPTED,
    SUSPEND,
    ScriptedRun,
    through_the_operator,
)

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
IN_POD: dict[str, dict[str, Any]] = {"default": {}, "emptyDir": {"volume": {"emptyDir": {"sizeLimit": "1Gi"}}}}
OUTLIVING: dict[str, dict[str, Any]] = {"claim": CLAIM, "bucket": {"storage": {"s3": S3}}}


def spec(checkpoint: dict[str, Any], **over: Any) -> MixedPrecisionJobSpec:
    doc = {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]}}
    return MixedPrecisionJobSpec.model_validate({**doc, "checkpoint": {"everySteps": 50, **checkpoint}, **over})


def ended(reason: Reason, code: int, *, checkpoint: int = 197) -> JobView:
    ref = CheckpointRef(
        step=checkpoint, path=f"/var/lib/mpjob/checkpoints/step-{checkpoint:09d}", sha256="ab", precision="fp16"
    )
    said = TerminationReport(reason=reason, step=checkpoint + 3, precision="fp16", last_good_checkpoint=ref)
    pod = PodView("p0", 0, "Failed", False, code, said.to_message())
    return JobView(0, "Failed", "BackoffLimitExceeded", pods=(pod,))


def after(s: MixedPrecisionJobSpec, ending: JobView) -> Plan:
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW).status
    return reconcile(s, first, 1, {0: ending}, NOW + timedelta(seconds=60))


def said(plan: Plan, reason: str, s: MixedPrecisionJobSpec | None = None) -> list[str]:
    """What `plan` says with `reason` once carried out (the Jobs of `s` it asks for made)."""
    return carried_out.said(s, plan, reason) if s is not None else [e.message for e in plan.told if e.reason == reason]


@pytest.mark.parametrize("where", list(IN_POD))
def test_a_fallback_through_a_restart_starts_over_and_says_the_checkpoints_stayed_in_the_pod(where: str) -> None:
    s = spec(IN_POD[where], precision={"mode": "fp16", "fallback": ["bf16"], "inPlace": False})
    assert not s.checkpoint.outlives_pods
    plan = after(s, ended(Reason.NUMERIC_FAULT, 42))
    assert [(c.precision, c.start_step, c.resume_from) for c in plan.create] == [("bf16", 0, None)]
    assert plan.status.attempts[1].start_step == 0
    assert plan.status.last_checkpoint is None  # it went with the pod: the status names none
    assert said(plan, "AttemptStarted", s) == [f"attempt 1 in bf16, {POD_CHECKPOINTS}"]
    assert said(plan, "PrecisionFallback") == [f"fp16 -> bf16 after NumericFault, {POD_CHECKPOINTS}"]
    cond = next(c for c in plan.status.conditions if c.type == ConditionType.PRECISION_FALLBACK)
    assert cond.message == f"fp16 -> bf16, {POD_CHECKPOINTS}"
    assert not any("197" in e.message for e in plan.events if e.reason != "AttemptEnded")


@pytest.mark.parametrize("where", list(OUTLIVING))
def test_a_fallback_through_a_restart_resumes_from_a_claim_or_a_bucket(where: str) -> None:
    s = spec(OUTLIVING[where])
    assert s.checkpoint.outlives_pods
    plan = after(s, ended(Reason.NUMERIC_FAULT, 42))
    assert [(c.precision, c.start_step) for c in plan.create] == [("bf16", 197)]
    assert said(plan, "AttemptStarted", s) == ["attempt 1 in bf16, to resume from checkpoint step 197"]
    assert plan.status.last_checkpoint is not None and plan.status.last_checkpoint.step == 197


@pytest.mark.parametrize(("where", "start"), [("default", 0), ("emptyDir", 0), ("claim", 197), ("bucket", 197)])
def test_a_preempted_attempt_goes_on_from_its_checkpoint_only_where_that_outlives_the_pod(
    where: str, start: int
) -> None:
    s = spec({**IN_POD, **OUTLIVING}[where])
    plan = after(s, ended(Reason.PREEMPTED, 44))
    assert [(c.precision, c.start_step) for c in plan.create] == [("fp16", start)]
    planned = f"to resume from checkpoint step {start}" if start else POD_CHECKPOINTS
    assert said(plan, "AttemptStarted", s) == [f"attempt 1 in fp16, {planned}"]


def suspend(s: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, pod: PodView) -> MixedPrecisionJobStatus:
    held = s.model_copy(update={"run_policy": s.run_policy.model_copy(update={"suspend": True})})
    return reconcile(held, status, 2, {0: JobView(0, pods=(pod,))}, NOW + timedelta(seconds=10)).status


def running_past(s: MixedPrecisionJobSpec, step: int, pod: PodView) -> MixedPrecisionJobStatus:
    """`s`'s first attempt running in `pod`, its checkpoint of `step` read."""
    first = reconcile(s, MixedPrecisionJobStatus(), 1, {}, NOW).status
    status = reconcile(s, first, 1, {0: JobView(0, pods=(pod,))}, NOW + timedelta(seconds=5)).status
    status.step, status.last_checkpoint = step, CheckpointStatus(step=step, sha256="ab", precision="fp16")
    status.attempts[0].progress_time = (NOW + timedelta(seconds=5)).isoformat()  # the live reading that showed it
    return status


@pytest.mark.parametrize(("where", "start"), [("default", 0), ("claim", 197)])
def test_a_resume_after_a_suspension_goes_on_from_what_outlived_the_pods(where: str, start: int) -> None:
    s, pod = spec({**IN_POD, **OUTLIVING}[where]), PodView("p0", 0, "Running", True)
    suspended = suspend(s, running_past(s, 197, pod), pod)
    assert suspended.phase == "Suspended"
    plan = reconcile(s, suspended, 3, {}, NOW + timedelta(seconds=20))
    assert [c.start_step for c in plan.create] == [start]
    planned = f"to resume from checkpoint step {start}" if start else POD_CHECKPOINTS
    assert said(plan, "AttemptStarted", s) == [f"attempt 1 in fp16, {planned}"]


def test_a_change_in_place_still_goes_on_from_the_checkpoint_in_its_pod() -> None:
    s = spec({}, resources={"gpusPerWorker": 1})
    pod = PodView("p0", 0, "Running", True, started_at=NOW.isoformat())
    change = InPlaceChange.model_validate(
        {"attempt": 1, "step": 160, "startStep": 150, "fromPrecision": "fp16", "toPrecision": "bf16",
         "rule": "MaxNonFiniteLosses", "message": "non-finite losses", "recoverySeconds": 0.2}
    )  # fmt: skip
    status = running_past(s, 150, pod)
    plan = reconcile(s, status, 1, {0: JobView(0, pods=(pod,))}, NOW + timedelta(seconds=30), changes=[change])
    assert plan.create == [] and plan.status.attempts[1].start_step == 150
    assert plan.status.last_checkpoint is not None and plan.status.last_checkpoint.step == 150
    assert said(plan, "AttemptStarted", s) == ["attempt 1 in bf16, to resume from checkpoint step 150"]


class StoppedAfterCheckpoint(ScriptedRun):
    """Ctrl-C (SUSPEND) stops the attempt after its trainer checkpointed step 40 on SIGTERM."""

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        if self.endings[0] == SUSPEND:
            self.endings.pop(0)
            self.ctrl_c.stop = Stop.ASKED
            return outcome_of(JobView(start.index, pods=PREEMPTED))
        return super()._run_attempt(start)


@pytest.mark.parametrize(("endings", "start"), [([FAULT, OK], 20), ([SUSPEND, OK], 40)], ids=["fallback", "resume"])
def test_mpjob_run_resumes_from_its_folder_where_the_operator_starts_over(
    endings: list[Any], start: int, tmp_path: Path
) -> None:
    s = spec({}, resources={"gpusPerWorker": 0})
    run = StoppedAfterCheckpoint(s, tmp_path / "run", endings)
    local = run.run()
    if run.endings:  # interrupted: run again with the same --out
        local = StoppedAfterCheckpoint(s, tmp_path / "run", run.endings).run()
    assert [(a.start_step, a.reason) for a in local.attempts][1:] == [(start, Reason.SUCCEEDED.value)]
    if endings[0] is FAULT:
        assert through_the_operator(s, endings).attempts[1].start_step == 0  # the same spec on a cluster


@pytest.mark.parametrize(("where", "start"), [("default", 0), ("claim", 50)])
def test_a_resized_attempts_late_report_moves_the_next_start_only_to_a_checkpoint_that_outlived_its_pods(
    where: str, start: int
) -> None:
    s, status = lost_nodes.running(2, checkpoint={"everySteps": 50, **{**IN_POD, **OUTLIVING}[where]})
    status = reconcile(s, status, 1, {0: JobView(0, pods=(PodView("p0", 0, "Running", True),))}, NOW).status
    status.attempts[0] = status.attempts[0].model_copy(
        update={"reason": Reason.SCALED_DOWN.value, "end_step": 40, "finish_time": st.stamp(NOW)}
    )
    status.last_checkpoint = status.last_checkpoint if start else None  # begin: it went with the pods
    status.attempts.append(status.attempts[0].model_copy(update={"index": 1, "start_step": 20 if start else 0}))
    status.attempts[1] = status.attempts[1].model_copy(update={"reason": None, "end_step": None, "finish_time": None})
    status.attempt, status.phase = 1, "Pending"
    plan = reconcile(s, status, 1, {}, NOW, stopped={0: cutoff_tests.stopped_at(50)})
    assert (plan.status.attempts[0].end_step, [a.start_step for a in plan.create]) == (50, [start])
    assert (plan.status.last_checkpoint.step if plan.status.last_checkpoint else 0) == start


READMITTED = {
    "default": f"starts again in fp16, {POD_CHECKPOINTS}",
    "claim": "resumes in fp16 from the newest checkpoint (step 197",
}


@pytest.mark.parametrize(("where", "goes_on"), list(READMITTED.items()))
def test_a_job_its_queue_preempts_starts_over_unless_its_checkpoints_outlive_the_pods(where: str, goes_on: str) -> None:
    s, pod = spec({**IN_POD, **OUTLIVING}[where]), PodView("p0", 0, "Running", True)
    plan = reconcile(s, running_past(s, 197, pod), 1, {0: JobView(0, suspended=True)}, NOW + timedelta(seconds=10))
    cond = next(c for c in plan.status.conditions if c.type == ConditionType.RUNNING)
    assert cond.reason == "AwaitingReadmission" and f"admitted again and {goes_on}" in cond.message
    assert [e.message for e in plan.events if e.reason == Reason.PREEMPTED.value] == [cond.message]


@pytest.mark.parametrize(("where", "planned"), [("default", POD_CHECKPOINTS), ("bucket", "to resume from its newest")])
def test_a_running_attempts_deleted_job_made_again_says_where_it_goes_on_from(where: str, planned: str) -> None:
    s, pod = spec({**IN_POD, **OUTLIVING}[where]), PodView("p0", 0, "Running", True)
    plan = reconcile(s, running_past(s, 197, pod), 1, {}, NOW + timedelta(seconds=20))
    assert [c.index for c in plan.create] == [0]
    (said_again,) = [e.message for e in plan.events if e.reason == "JobRecreated"]
    assert said_again.split("(uncharged), ")[1].startswith(planned)


@pytest.mark.parametrize(("where", "named"), [("default", None), ("emptyDir", None), ("claim", 250)])
def test_a_suspended_job_names_a_checkpoint_only_where_that_outlived_its_pods(where: str, named: int | None) -> None:
    s, pod = spec({**IN_POD, **OUTLIVING}[where]), PodView("p0", 0, "Running", True)
    held = s.model_copy(update={"run_policy": s.run_policy.model_copy(update={"suspend": True})})
    suspended = suspend(s, running_past(s, 197, pod), pod)
    # Its pods go with its Job: a checkpoint in them is no promise of where a resume goes on from.
    assert (suspended.last_checkpoint.step if suspended.last_checkpoint else None) == (named and 197)
    cond = next(c for c in suspended.conditions if c.type == ConditionType.SUSPENDED)
    assert (cond.message.endswith(f"{POD_CHECKPOINTS}: a resume starts at step 0")) == (named is None)
    stopped = {0: cutoff_tests.stopped_at(250)}  # its trainer checkpointed step 250 on SIGTERM
    status = reconcile(held, suspended, 2, {}, NOW + timedelta(seconds=15), stopped=stopped).status
    assert (status.phase, status.attempts[0].end_step, status.step) == ("Suspended", 250, 250)
    assert (status.last_checkpoint.step if status.last_checkpoint else None) == named
    shown = summary_lines("job", status)  # what `mpjob status` prints
    assert any(line.startswith("  last checkpoint: step 250") for line in shown) == (named is not None)
    plan = reconcile(s, status, 3, {}, NOW + timedelta(seconds=20), stopped=stopped)
    planned = f"to resume from checkpoint step {named}" if named else POD_CHECKPOINTS
    assert said(plan, "AttemptStarted", s) == [f"attempt 1 in fp16, {planned}"]
    assert [c.start_step for c in plan.create] == [named or 0]


@pytest.mark.parametrize(("where", "named"), [("default", None), ("emptyDir", None), ("claim", 250), ("bucket", 250)])
def test_a_job_failed_at_its_deadline_names_a_checkpoint_only_where_that_outlived_its_pods(
    where: str, named: int | None
) -> None:
    s = spec({**IN_POD, **OUTLIVING}[where], runPolicy={"activeDeadlineSeconds": 60})
    pod = PodView("p0", 0, "Running", True)
    past = reconcile(s, running_past(s, 197, pod), 1, {0: JobView(0, pods=(pod,))}, NOW + timedelta(seconds=61))
    # Its Job is deleted at the deadline, and its pods with it: so is a checkpoint they held.
    assert (past.status.phase, past.delete) == ("Failed", [0])
    assert (past.status.last_checkpoint.step if past.status.last_checkpoint else None) == (named and 197)
    assert past.status.message.endswith("its checkpoints went with its pods (emptyDir)") == (named is None)
    stopped = {0: cutoff_tests.stopped_at(250)}  # its trainer checkpointed step 250 on SIGTERM
    status = reconcile(s, past.status, 1, {}, NOW + timedelta(seconds=70), stopped=stopped).status
    assert (status.phase, status.attempts[0].end_step, status.step) == ("Failed", 250, 250)
    assert (status.last_checkpoint.step if status.last_checkpoint else None) == named
    shown = summary_lines("job", status)  # what `mpjob status` prints
    assert any(line.startswith("  last checkpoint: step 250") for line in shown) == (named is not None)
