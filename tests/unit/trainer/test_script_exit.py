"""A script's own sys.exit() inside the session: its code by the code's meaning, except the
codes of what only the session decides (42, 44-47), which end the process 1 with an InfraError
report naming the script's exit; a message given to sys.exit() is kept in the report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    return in_process_launch(tmp_path, monkeypatch, spec(training={"steps": 4}))


EXITS = {
    "a numeric fault's code": (42, 1, "InfraError", "the script exited with code 42 (sys.exit(42)): 42 means"),
    "a preemption's code": (44, 1, "InfraError", "the script exited with code 44 (sys.exit(44)): 44 means Preempted"),
    "a re-promotion's code": (47, 1, "InfraError", "the script exited with code 47 (sys.exit(47))"),
    "a configuration error's code": (43, 43, "ConfigError", "the script exited with code 43"),
    "any other code": (3, 3, "InfraError", "the script exited with code 3"),
    "a message": ("no data in /data", 1, "InfraError", "the script exited: no data in /data"),
    "nothing": (None, 0, "Succeeded", "trained 0 steps"),
}


@pytest.mark.parametrize(("given", "code", "reason", "says"), EXITS.values(), ids=EXITS.keys())
def test_a_scripts_own_exit_is_read_by_who_decided_it(
    tmp_path: Path, launch: AttemptLaunch, given: int | str | None, code: int, reason: str, says: str
) -> None:
    ended = 0
    try:
        with mpjob.start(launch=launch):
            sys.exit(given)
    except SystemExit as exc:
        ended = int(exc.code or 0)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert (ended, report.reason) == (code, reason), report
    assert report.message.startswith(says), report.message
