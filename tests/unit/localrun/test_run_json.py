"""`mpjob run --json` writes JSON lines only on stdout: an error that ends the command before the
run (a manifest it cannot read or that fails validation, a bad argument, argparse's own) is an
`error` event there, with the exit code the plain output has (2); the usage stays on stderr."""

from __future__ import annotations

import io
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.localrun.progress import JsonView
from mpjob.localrun.series import Point
from tests import warm
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

JOB = tiny_job()


def mpjob_run(folder: Path, *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    """The real command's exit code, its stdout's lines (each must be a JSON object) and its stderr."""
    command = [sys.executable, "-m", "mpjob.cli", "run", *argv]
    done = warm.run(command, cwd=folder, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(isinstance(line, dict) and "event" in line for line in lines), done.stdout
    return done.returncode, lines, done.stderr


def manifest(folder: Path, **training: Any) -> str:
    job = {**JOB, "spec": {**JOB["spec"], "training": {**JOB["spec"]["training"], **training}}}
    (folder / "job.yaml").write_text(yaml.safe_dump(job))
    return "job.yaml"


def test_a_missing_manifest_is_an_error_event(tmp_path: Path) -> None:
    code, lines, _ = mpjob_run(tmp_path, "missing.yaml", "--json")
    assert code == 2
    assert lines == [{"event": "error", "message": "missing.yaml: cannot read: No such file or directory"}]


def test_a_manifests_bad_field_is_an_error_event_naming_the_field(tmp_path: Path) -> None:
    code, lines, _ = mpjob_run(tmp_path, manifest(tmp_path, steps=0), "--json")
    assert code == 2
    assert [(line["event"], line.get("field")) for line in lines] == [("error", "spec.training.steps")]
    assert lines[0]["message"].startswith("job.yaml: spec.training.steps: "), lines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "", "--json"], "argument --out: an empty path; name the run's folder"),
        (["--js", "--bogus"], "unrecognized arguments: --bogus"),  # an abbreviated --json counts
        (["--json", "--plain"], "argument --plain: not allowed with argument --json"),
        (["--json", "--workers-available", "x"], "--workers-available "),
    ],
    ids=["argparse-value", "unknown-flag", "both-modes", "own-value"],
)
def test_a_bad_argument_is_an_error_event_whatever_its_place(tmp_path: Path, argv: list[str], message: str) -> None:
    """Also one argparse meets before --json: --json is read first."""
    code, lines, _ = mpjob_run(tmp_path, manifest(tmp_path), *argv)
    assert code == 2
    assert [line["event"] for line in lines] == ["error"] and lines[0]["message"].startswith(message), lines
    assert list(tmp_path.iterdir()) == [tmp_path / "job.yaml"]  # no run started


def test_help_under_json_leaves_stdout_to_json(tmp_path: Path) -> None:
    code, lines, stderr = mpjob_run(tmp_path, "--json", "--help")
    assert (code, lines) == (0, []) and "usage: mpjob run" in stderr


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is no JSON")


def test_a_non_finite_figure_is_written_as_the_trainers_lines_write_it() -> None:
    """A faulting attempt's steps log a nan loss: a bare NaN made the line no JSON for a strict
    parser (JavaScript's, Go's); the trainer's own event lines write "nan" and "inf"."""
    out = io.StringIO()
    point = Point(
        0, "fp16", 20, loss=math.nan, loss_scale=2048.0, grad_norm=math.inf, overflow_steps=5, samples_per_second=9.5
    )
    JsonView(out).step(point)
    line = json.loads(out.getvalue(), parse_constant=_no_constants)
    assert (line["loss"], line["gradNorm"], line["lossScale"]) == ("nan", "inf", 2048.0)
