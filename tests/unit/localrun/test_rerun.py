"""Which ended runs a rerun of the same --out takes up again (`localrun.rerun`): one that failed on
a configuration error goes on from its newest checkpoint while runPolicy.maxAttempts leaves an
attempt; every other ending is left as it ended."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob.localrun import rerun
from mpjob.localrun.cli import run_command
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

FINISHED_AT = "2026-01-01T00:00:10+00:00"


def failed(reason: str, why: str) -> dict[str, Any]:
    """A report.json of a run whose attempt 0 (fp32) ended `reason` and failed the job for `why`."""
    condition = {"type": "Failed", "status": "True", "reason": why, "lastTransitionTime": FINISHED_AT}
    attempt = {"index": 0, "precision": "fp32", "startStep": 0, "endStep": 3, "reason": reason}
    attempt["finishTime"] = FINISHED_AT
    return {
        "phase": "Failed",
        "step": 3,
        "totalSteps": 4,
        "completionTime": FINISHED_AT,
        "lastCheckpoint": {"step": 2, "path": "/run/checkpoints/step-2"},
        "attempts": [attempt],
        "conditions": [condition],
    }


def spec(max_attempts: int) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "mlp"}, "training": {"steps": 4}, "runPolicy": {"maxAttempts": max_attempts}}
    )


def reopened(report: dict[str, Any], max_attempts: int) -> lc.Plan:
    plan = lc.Plan(status=MixedPrecisionJobStatus.model_validate(report))
    rerun.reopen(plan, spec(max_attempts), lc.When(st.now()))
    return plan


def test_a_configuration_error_reopens_from_the_newest_checkpoint_in_the_attempts_precision() -> None:
    report = failed("ConfigError", "ConfigError")
    status = MixedPrecisionJobStatus.model_validate(report)
    assert rerun.reopens(status)
    assert rerun.fix_line(status) == (
        "  rerun:  fix the configuration error and run `mpjob run` again with the same --out; "
        "it resumes from checkpoint step 2"
    )
    plan = reopened(report, max_attempts=6)
    assert [(s.index, s.precision, s.start_step) for s in plan.create] == [(1, "fp32", 2)]
    assert plan.status.phase == "Pending" and plan.status.completion_time is None and plan.status.message is None
    assert [(c.type, c.status) for c in plan.status.conditions if c.type == "Failed"] == [("Failed", "False")]
    assert rerun.fix_line(plan.status) is None


def test_a_rerun_with_no_attempt_left_fails_again_naming_max_attempts_and_reopens_once_raised() -> None:
    plan = reopened(failed("ConfigError", "ConfigError"), max_attempts=1)
    assert plan.create == [] and plan.status.phase == "Failed"
    assert plan.status.message == "no attempt left to rerun: runPolicy.maxAttempts is 1; raise it to go on"
    assert rerun.fix_line(plan.status) == f"  rerun:  {plan.status.message}"  # what to do, not "fix the configuration"
    assert rerun.reopens(plan.status)
    again = reopened(plan.status.to_api(), max_attempts=2)
    assert [(s.index, s.start_step) for s in again.create] == [(1, 2)]


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("InfraError", "FailedAtTheSameStep"),
        ("NonFiniteInFp32", "NonFiniteInFp32"),
        ("InfraError", "AttemptsExhausted"),
    ],
)
def test_a_rerun_of_any_other_failure_runs_nothing_and_leaves_its_report(
    tmp_path: Path, reason: str, why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(json.dumps({"name": "local"}) + "\n")
    (out / "report.json").write_text(json.dumps(failed(reason, why)))
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({**tiny_job(), "spec": {**tiny_job()["spec"], "training": {"steps": 4}}}))
    assert not rerun.reopens(MixedPrecisionJobStatus.model_validate(failed(reason, why)))
    assert run_command([str(manifest), "--out", str(out), "--plain", "--no-plot"]) == 1
    said = capsys.readouterr().out
    assert f"{out / 'report.json'} says this run already ended Failed; use --fresh" in said, said
    assert "rerun:" not in said, said
    left = MixedPrecisionJobStatus.model_validate_json((out / "report.json").read_text())
    assert left.to_api() == MixedPrecisionJobStatus.model_validate(failed(reason, why)).to_api()


def test_a_rerun_with_no_attempt_left_says_what_to_do_at_its_end_and_in_its_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "job.json").write_text(json.dumps({"name": "local"}) + "\n")
    (out / "report.json").write_text(json.dumps(failed("ConfigError", "ConfigError")))
    manifest = tmp_path / "job.yaml"
    job = tiny_job()
    manifest.write_text(yaml.safe_dump({**job, "spec": {**job["spec"], "runPolicy": {"maxAttempts": 1}}}))
    assert run_command([str(manifest), "--out", str(out), "--plain", "--no-plot"]) == 1
    said = capsys.readouterr().out
    raise_it = "  rerun:  no attempt left to rerun: runPolicy.maxAttempts is 1; raise it to go on"
    assert raise_it in said.splitlines(), said
    assert main(["status", str(out)]) == 0
    assert raise_it in capsys.readouterr().out.splitlines()
