"""Honest phases and figures: a job is not Running before a trainer pod runs; pods the Job
controller cannot create show as PodsCreated=False with its message and fail the job after
runPolicy.podCreationTimeoutSeconds; live figures are each attempt's own, and lossScale is
only an fp16 figure."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob.planning.status import status_patch
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import Counters, TerminationReport

pytestmark = pytest.mark.unit
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
REFUSED = 'Error creating: pods "j-a0-0-x" is forbidden: violates PodSecurity "restricted:latest": hostPath'


def spec(**over: object) -> MixedPrecisionJobSpec:
    base = {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}, "runPolicy": {"podCreationTimeoutSeconds": 60}}
    return MixedPrecisionJobSpec.model_validate({**base, **over})


def started() -> MixedPrecisionJobStatus:
    return reconcile(spec(), MixedPrecisionJobStatus(), 1, {}, T0).status


def condition(status: MixedPrecisionJobStatus, type_: str) -> tuple[str, str, str] | None:
    found = next((c for c in status.conditions if c.type == type_), None)
    return (found.status, found.reason, found.message) if found else None


def running_pod(phase: str = "Running") -> PodView:
    return PodView("j-a0-0-x", 0, phase, alive=True)


def test_the_phase_is_pending_until_a_trainer_pod_runs() -> None:
    status = started()
    assert status.phase == "Pending" and condition(status, "Running")[:2] == ("False", "AttemptStarted")  # type: ignore[index]
    status = reconcile(spec(), status, 1, {0: JobView(0)}, T0).status  # the Job, no pod yet
    assert status.phase == "Pending"
    status = reconcile(spec(), status, 1, {0: JobView(0, pods=(running_pod("Pending"),))}, T0).status
    assert status.phase == "Pending"
    status = reconcile(spec(), status, 1, {0: JobView(0, pods=(running_pod(),))}, T0).status
    assert status.phase == "Running" and condition(status, "Running")[:2] == ("True", "AttemptRunning")  # type: ignore[index]
    assert condition(status, "PodsCreated") is None  # a job that never had trouble carries none


def test_pods_that_cannot_be_created_show_at_once_with_the_controllers_message() -> None:
    refused = {0: JobView(0, create_error=REFUSED)}
    plan = reconcile(spec(), started(), 1, refused, T0 + timedelta(seconds=5))
    assert plan.status.phase == "Pending"
    assert condition(plan.status, "PodsCreated") == ("False", "FailedCreate", REFUSED)
    assert [(e.type, e.reason, e.message) for e in plan.events] == [("Warning", "FailedCreate", REFUSED)]
    again = reconcile(spec(), plan.status, 1, refused, T0 + timedelta(seconds=10))
    assert again.events == [] and again.status == plan.status  # said once


def test_pods_not_created_within_the_timeout_fail_the_job_with_that_message() -> None:
    status = reconcile(spec(), started(), 1, {0: JobView(0, create_error=REFUSED)}, T0 + timedelta(seconds=5)).status
    plan = reconcile(spec(), status, 1, {0: JobView(0, create_error=REFUSED)}, T0 + timedelta(seconds=60))
    assert plan.status.phase == "Failed" and plan.delete == [0]
    assert "podCreationTimeoutSeconds=60" in (plan.status.message or "") and REFUSED in (plan.status.message or "")
    assert condition(plan.status, "Failed")[:2] == ("True", "PodCreationTimeout")  # type: ignore[index]
    assert plan.status.attempts[0].reason == "PodCreationTimeout"


def test_pods_created_after_all_turn_the_condition_true_and_the_job_runs() -> None:
    status = reconcile(spec(), started(), 1, {0: JobView(0, create_error=REFUSED)}, T0).status
    created = {0: JobView(0, pods=(running_pod(),), create_error=REFUSED)}  # the old Event lingers
    status = reconcile(spec(), status, 1, created, T0 + timedelta(seconds=120)).status
    assert status.phase == "Running" and condition(status, "PodsCreated")[:2] == ("True", "PodsCreated")  # type: ignore[index]


def test_a_job_waiting_for_its_queue_says_so() -> None:
    status = reconcile(spec(), started(), 1, {0: JobView(0, suspended=True)}, T0).status
    assert status.phase == "Pending" and condition(status, "Running")[1] == "AwaitingAdmission"  # type: ignore[index]


def test_a_new_attempt_starts_without_the_last_ones_figures() -> None:
    status = started()
    status.phase, status.loss, status.loss_scale, status.samples_per_second = "Running", 2.5, 1024.0, 100.0
    report = TerminationReport(reason=Reason.NUMERIC_FAULT, step=30, precision="fp16", message="overflow")
    fault = {0: JobView(0, "Failed", pods=(PodView("p", 0, "Failed", False, 42, report.to_message()),))}
    plan = reconcile(spec(precision={"mode": "fp16", "fallback": ["bf16"]}), status, 1, fault, T0)
    assert plan.status.precision == "bf16"
    assert (plan.status.loss, plan.status.loss_scale, plan.status.samples_per_second) == (None, None, None)
    patch = status_patch(status.to_api(), plan.status)
    assert patch["loss"] is None and patch["lossScale"] is None  # the stored figures are deleted


@pytest.mark.parametrize(("precision", "scale"), [("fp16", 512.0), ("bf16", None), ("fp32", None)])
def test_the_final_figures_come_from_the_termination_report(precision: str, scale: float | None) -> None:
    s = spec(precision={"mode": precision})
    status = reconcile(s, MixedPrecisionJobStatus(), 1, {}, T0).status
    counters = Counters(overflowSteps=3 if precision == "fp16" else 0, lossScale=512.0 if precision == "fp16" else 0)
    report = TerminationReport(reason=Reason.SUCCEEDED, step=60, precision=precision, counters=counters)
    done = {0: JobView(0, "Complete", pods=(PodView("p", 0, "Succeeded", False, 0, report.to_message()),))}
    final = reconcile(s, status, 1, done, T0).status
    assert final.phase == "Succeeded" and final.step == 60 and final.loss_scale == scale
    assert "lossScale" not in final.to_api() or precision == "fp16"


NO_SECRET = 'secret "s3-keys" not found'


def held(message: str = NO_SECRET) -> dict[int, JobView]:
    """The kubelet cannot make the trainer container's environment (CreateContainerConfigError)."""
    return {0: JobView(0, pods=(PodView("j-a0-0-x", 0, "Pending", alive=True, config_error=message),))}


def s3_spec() -> MixedPrecisionJobSpec:
    s3 = {"bucket": "ckpts", "endpoint": "http://s3:9000", "credentialsSecret": "s3-keys"}
    return spec(checkpoint={"storage": {"s3": s3}})


def test_a_credentials_secret_that_is_not_there_is_said_at_once_naming_the_field() -> None:
    """A checkpoint bucket's credentialsSecret that does not exist held the pod Pending (its
    container waiting, CreateContainerConfigError) and the job said only "waiting for its pods"."""
    plan = reconcile(s3_spec(), started(), 1, held(), T0 + timedelta(seconds=5))
    found = condition(plan.status, "PodsCreated")
    assert plan.status.phase == "Pending" and found is not None, plan.status
    assert found[:2] == ("False", "CreateContainerConfigError") and NO_SECRET in found[2]
    assert "'s3-keys' (checkpoint.storage.s3.credentialsSecret)" in found[2]
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "CreateContainerConfigError")]
    again = reconcile(s3_spec(), plan.status, 1, held(), T0 + timedelta(seconds=10))
    assert again.events == [] and again.status == plan.status  # said once


def test_a_missing_key_of_a_template_secret_names_the_template_and_fails_after_the_timeout() -> None:
    said = "couldn't find key TOKEN in Secret ns/other"
    status = reconcile(s3_spec(), started(), 1, held(said), T0 + timedelta(seconds=5)).status
    assert "'other' (template.env)" in condition(status, "PodsCreated")[2]  # type: ignore[index]
    plan = reconcile(s3_spec(), status, 1, held(said), T0 + timedelta(seconds=60))
    assert plan.status.phase == "Failed" and said in (plan.status.message or "")
    assert "podCreationTimeoutSeconds=60" in (plan.status.message or "")


def test_a_job_failed_for_pods_never_made_no_longer_says_it_waits_for_them() -> None:
    """PodsCreated=False stayed on a job that failed after podCreationTimeoutSeconds; now Unknown,
    reason Failed (the Failed condition says why)."""
    status = reconcile(spec(), started(), 1, {0: JobView(0, create_error=REFUSED)}, T0 + timedelta(seconds=5)).status
    plan = reconcile(spec(), status, 1, {0: JobView(0, create_error=REFUSED)}, T0 + timedelta(seconds=60))
    assert plan.status.phase == "Failed"
    said = condition(plan.status, "PodsCreated")
    assert said == ("Unknown", "Failed", "attempt 0 no longer waits for its pods to be made: the job is Failed")


def test_a_pod_refused_is_seen_after_an_edit_of_processes_per_worker_by_the_jobs_own_count() -> None:
    """An fsdp job of 2 workers x 2 processes, edited to 4 processes per worker while its first
    attempt runs: that attempt still has 2 pods (its Job's completions), so the second one refused
    is a pod not created, not a job whose 4 processes the one pod made holds."""
    resources = {"gpusPerWorker": 0, "processesPerWorker": 2}
    two = spec(workers=2, parallelism={"strategy": "fsdp"}, resources=resources)
    status = reconcile(two, MixedPrecisionJobStatus(), 1, {}, T0).status
    edited = spec(workers=2, parallelism={"strategy": "fsdp"}, resources={**resources, "processesPerWorker": 4})
    job = JobView(0, pods=(running_pod(),), create_error=REFUSED, workers=2)
    plan = reconcile(edited, status, 1, {0: job}, T0 + timedelta(seconds=5))
    assert condition(plan.status, "PodsCreated") == ("False", "FailedCreate", REFUSED)
