"""`mpjob run` of your own training code (examples/own-loop/train.py on the SDK, two processes
under the launcher): it falls back and resumes like a builtin job, and shows the same
progress, report and plot."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import mpjob_run_json

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
OWN_LOOP = REPO / "examples" / "own-loop" / "train.py"
SHARED = {
    "training": {"steps": 50, "batchSize": 8, "logEvery": 5, "seed": 0},
    # Both restart: the own loop registers no step, so it cannot fall back in place (the builtin
    # could): like is compared with like.
    "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "inPlace": False},
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
    return mpjob_run_json(tmp / name, {**doc, "spec": {**SHARED, **spec}}, plot=True)


def shape(events: list[dict[str, Any]], report: dict[str, Any]) -> dict[str, Any]:
    """What a user sees, without the values: event kinds and fields, report fields."""
    return {
        "events": sorted({e["event"] for e in events}),
        "stepFields": sorted({k for e in events if e["event"] == "step" for k in e}),
        "report": sorted(report),
        "attemptFields": sorted({k for a in report["attempts"] for k in a}),
    }


@pytest.mark.process
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
