"""`mpjob run` of your own training code (examples/own-loop/train.py on the SDK, two processes
under the launcher): it falls back and resumes like a builtin job, and shows the same
progress, report and plot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
OWN_LOOP = REPO / "examples" / "own-loop" / "train.py"
SHARED = {
    "training": {"steps": 50, "batchSize": 8, "logEvery": 5, "seed": 0},
    "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
    "checkpoint": {"everySteps": 10},
}
OWN = {
    "task": {"command": [sys.executable, str(OWN_LOOP), "--samples", "1024", "--hidden", "32", "--overflow-at", "25"]},
    "resources": {"gpusPerWorker": 0, "processesPerWorker": 2},
}
BUILTIN = {
    "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 512, "overflowAtStep": 25}},
    "resources": {"gpusPerWorker": 0},
}


def run_job(tmp: Path, name: str, spec: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": name}}
    (tmp / name).mkdir()
    path = tmp / name / "job.yaml"
    path.write_text(yaml.safe_dump({**doc, "spec": {**SHARED, **spec}}))
    out = tmp / name / "out"
    result = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "run", str(path), "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return events, json.loads((out / "report.json").read_text()), out


def shape(events: list[dict[str, Any]], report: dict[str, Any]) -> dict[str, Any]:
    """What a user sees, without the values: event kinds and fields, report fields."""
    return {
        "events": sorted({e["event"] for e in events}),
        "stepFields": sorted({k for e in events if e["event"] == "step" for k in e}),
        "report": sorted(report),
        "attemptFields": sorted({k for a in report["attempts"] for k in a}),
    }


def test_own_code_recovers_and_looks_like_a_builtin_job(tmp_path: Path) -> None:
    own_events, own, own_out = run_job(tmp_path, "own", OWN)
    first, second = own["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert second["startStep"] == 20 > 0  # the last good checkpoint before the overflow at 25
    assert first["worldSize"] == second["worldSize"] == 2
    assert own["phase"] == "Succeeded" and own["step"] == 50 and own["lastCheckpoint"]["step"] == 50
    assert any(e["event"] == "precisionFallback" and e["toPrecision"] == "bf16" for e in own_events)

    builtin_events, builtin, builtin_out = run_job(tmp_path, "builtin", BUILTIN)
    assert shape(own_events, own) == shape(builtin_events, builtin)
    for out in (own_out, builtin_out):
        assert (out / "training.png").read_bytes()[:4] == b"\x89PNG"
        series = json.loads((out / "series.json").read_text())
        assert {p["precision"] for p in series["points"]} == {"fp16", "bf16"}
