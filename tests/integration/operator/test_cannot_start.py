"""Own code that cannot start, on the real control plane: the launcher quotes the rank's
stderr in the pod's termination report, and the operator ends the job Failed on the second
identical failure before a first step, with the cause in the status message, instead of
spending every attempt of runPolicy.maxAttempts; a script that is not there is a configuration
error of the first attempt, which ends the job."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.operator.conftest import Jobs, Operator

pytestmark = pytest.mark.integration


def command_spec(command: list[str]) -> dict[str, object]:
    return {
        "task": {"command": command},
        "training": {"steps": 20, "logEvery": 5},
        "precision": {"mode": "fp32"},
        "checkpoint": {"everySteps": 10},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"maxAttempts": 6},
    }


def test_a_script_that_cannot_start_fails_in_two_attempts_with_its_error_in_the_status(
    operator: Operator, jobs: Jobs, tmp_path: Path
) -> None:
    name, cause = "noimport", "ModuleNotFoundError: No module named 'mpjob_no_such_module'"
    script = tmp_path / "train.py"
    script.write_text("import mpjob_no_such_module\n")
    jobs.create(name, command_spec([sys.executable, str(script)]))
    status = jobs.wait_phase(name, ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Failed", status
    assert len(status["attempts"]) == 2, status["attempts"]
    for attempt in status["attempts"]:
        assert attempt["reason"] == "InfraError" and cause in attempt["message"], attempt
    assert cause in status["message"] and "before their first step" in status["message"], status["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailedBeforeFirstStep" and cause in failed["message"]


def test_a_script_that_does_not_exist_fails_in_one_attempt_as_a_configuration_error(
    operator: Operator, jobs: Jobs, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    jobs.create("missing", command_spec([sys.executable, str(script)]))
    status = jobs.wait_phase("missing", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Failed", status
    [only] = status["attempts"]
    assert (only["reason"], only["exitCode"]) == ("ConfigError", 43), only
    assert f"its script {str(script)!r} does not exist" in only["message"], only
    assert str(script) in status["message"], status["message"]
