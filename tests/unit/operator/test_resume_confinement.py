"""`resumeFrom` stays in the checkpoint volume: a termination report is the trainer's word, and
a path outside the checkpoint directory never becomes the next attempt's resumeFrom."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.lifecycle import Plan, When, begin, conclude
from mpjob.planning.planner import StartAttempt, first_attempt
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.launch import CHECKPOINT_MOUNT, AttemptLaunch, inside_checkpoint_dir, job_checkpoint_dir
from mpjob_contract.report import CheckpointRef, TerminationReport
from tests.unit.operator.cases import CLAIM

pytestmark = pytest.mark.unit
SPEC = MixedPrecisionJobSpec.model_validate(
    {"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}, "checkpoint": CLAIM}
)


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        (f"{CHECKPOINT_MOUNT}/step-000000200", True),
        (f"{CHECKPOINT_MOUNT}/./step-000000200/", True),
        (f"{CHECKPOINT_MOUNT}/a/../step-000000200", True),
        (CHECKPOINT_MOUNT, False),  # the directory itself is not a checkpoint
        (f"{CHECKPOINT_MOUNT}/..", False),
        (f"{CHECKPOINT_MOUNT}/../../../etc", False),
        (f"{CHECKPOINT_MOUNT}-evil/step-000000200", False),  # a sibling sharing the prefix
        ("/etc/kubernetes", False),
        ("step-000000200", False),  # relative against an absolute directory
        (f"{CHECKPOINT_MOUNT}/step\0", False),
    ],
)
def test_inside_checkpoint_dir_judges_the_resolved_names(path: str, inside: bool) -> None:
    assert inside_checkpoint_dir(path, CHECKPOINT_MOUNT) is inside


def test_relative_directories_confine_relative_paths() -> None:
    assert inside_checkpoint_dir("runs/a/checkpoints/step-1", "runs/a/checkpoints")
    assert not inside_checkpoint_dir("runs/a/checkpoints/../../b", "runs/a/checkpoints")


@pytest.mark.parametrize(
    ("namespace", "name", "uid"), [("", "j", "u"), ("ns", "a/b", "u"), ("ns", "..", "u"), ("ns", "j", ".")]
)
def test_a_job_folder_is_one_segment_per_name(namespace: str, name: str, uid: str) -> None:
    with pytest.raises(ValueError, match="cannot name a checkpoint folder"):
        job_checkpoint_dir(namespace=namespace, name=name, uid=uid)
    assert job_checkpoint_dir(namespace="ns", name="j", uid="u") == f"{CHECKPOINT_MOUNT}/ns/j/u"


def _launch(resume_from: str | None, checkpoint_dir: str = CHECKPOINT_MOUNT) -> AttemptLaunch:
    return AttemptLaunch(
        job_name="j", precision="bf16", resume_from=resume_from, checkpoint_dir=checkpoint_dir, spec=SPEC
    )


def test_a_launch_refuses_to_resume_outside_its_checkpoint_dir() -> None:
    assert _launch(f"{CHECKPOINT_MOUNT}/step-000000200").resume_from == f"{CHECKPOINT_MOUNT}/step-000000200"
    assert _launch(None).resume_from is None
    with pytest.raises(ValidationError, match="is not inside checkpointDir"):
        _launch("/var/run/secrets/kubernetes.io/serviceaccount")


def test_the_trainer_side_refuses_a_forged_launch_too() -> None:
    """The trainer reads the launch through the same model, so an edited env var is refused."""
    forged = _launch(None).to_env().replace('"resumeFrom":null', '"resumeFrom":"/etc"')
    with pytest.raises(ValidationError, match="resumeFrom '/etc'"):
        AttemptLaunch.model_validate_json(forged)


def _numeric_fault(path: str) -> AttemptOutcome:
    ref = CheckpointRef(step=200, path=path, sha256="ab", precision="fp16")
    report = TerminationReport(reason=Reason.NUMERIC_FAULT, step=230, precision="fp16", last_good_checkpoint=ref)
    return AttemptOutcome(42, report)


def _next_attempt(outcome: AttemptOutcome, **where: str | bool) -> StartAttempt:
    plan, when = Plan(status=MixedPrecisionJobStatus()), When("2026-01-01T00:00:00Z")
    start = first_attempt(SPEC)
    begin(plan, SPEC, start, when)
    plan = Plan(status=plan.status)
    conclude(plan, SPEC, attempt=start, outcome=outcome, when=when, **where)
    (nxt,) = plan.create
    return nxt


def test_the_next_precision_resumes_from_the_reported_checkpoint_in_the_volume() -> None:
    nxt = _next_attempt(_numeric_fault(f"{CHECKPOINT_MOUNT}/step-000000200"))
    assert (nxt.precision, nxt.resume_from, nxt.start_step) == ("bf16", f"{CHECKPOINT_MOUNT}/step-000000200", 200)


@pytest.mark.parametrize("path", ["/etc", f"{CHECKPOINT_MOUNT}/../../home", "relative/step-000000200"])
def test_a_reported_path_outside_the_volume_falls_back_to_the_newest_valid_checkpoint(path: str) -> None:
    nxt = _next_attempt(_numeric_fault(path))
    assert nxt.precision == "bf16" and nxt.resume_from is None  # the trainer then takes the newest valid one
    _launch(nxt.resume_from)  # and the launch built from it is valid


def test_a_local_run_confines_to_its_own_checkpoint_dir() -> None:
    local = "/home/me/runs/j/checkpoints"
    nxt = _next_attempt(_numeric_fault(f"{local}/step-000000200"), checkpoint_dir=local, outlive=True)
    assert nxt.resume_from == f"{local}/step-000000200"
    elsewhere = _numeric_fault(f"{CHECKPOINT_MOUNT}/step-1")
    assert _next_attempt(elsewhere, checkpoint_dir=local, outlive=True).resume_from is None
