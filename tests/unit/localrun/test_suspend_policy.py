"""runPolicy.suspend through `mpjob run`: as the operator starts no attempt of a suspended job,
the run starts none; it says so and how to run it, records the job Suspended and exits 130,
without the spec's warnings (said once something runs). Cleared, the same --out runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from mpjob.localrun.cli import run_command
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit


def write(tmp: Path, *, suspend: bool) -> Path:
    doc = tiny_job("held")
    doc["spec"]["runPolicy"] = {"suspend": suspend}
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.process
def test_a_suspended_job_starts_nothing_until_suspend_is_cleared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run_command([str(write(tmp_path, suspend=True)), "--out", str(out), "--json", "--no-plot"]) == 130
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert not [e for e in said if e["event"] == "attemptStarted"], said
    assert any("runPolicy.suspend" in e["message"] and "false" in e["message"] for e in said if "message" in e)
    report = json.loads((out / "report.json").read_text())
    assert report["phase"] == "Suspended" and report["attempts"] == [], report
    assert "runPolicy.suspend" in report["message"]
    assert said[-1]["phase"] == "Suspended" and said[-1]["report"] == str(out / "report.json")
    assert said[-1]["message"].splitlines()[0] == "held: Suspended at step 0"  # no precision before an attempt
    assert not (out / "attempts").exists() and not (out / "checkpoints").exists()
    assert not [e for e in said if "warning:" in e.get("message", "")], said  # checkpoint.everySteps 200

    assert run_command([str(write(tmp_path, suspend=False)), "--out", str(out), "--json", "--no-plot"]) == 0
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    spec_warnings = [e for e in said if "warning: spec." in e.get("message", "")]  # not what the node measured
    assert [e["field"] for e in spec_warnings] == ["spec.checkpoint.everySteps"], said
    report = json.loads((out / "report.json").read_text())
    assert report["phase"] == "Succeeded" and report["step"] == 2, report
    assert [a["index"] for a in report["attempts"]] == [0]
