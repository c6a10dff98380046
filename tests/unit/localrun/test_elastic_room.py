"""`mpjob run --workers-available`: a smaller elastic attempt that ends another way (a numeric
fault) while the simulated cluster holds more workers is followed by one of the size that fits
now, as the operator follows it: not by a small one that grows at its first checkpoint, a
restart more."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.localrun.test_elastic_run import run

pytestmark = pytest.mark.unit

JOB: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "room"},
    "spec": {
        "workers": 2,
        "task": {"module": "tests.unit.localrun.elastic_task:make_task", "args": {"samples": 64, "overflowAtStep": 25}},
        "training": {"steps": 40, "batchSize": 4, "logEvery": 1, "learningRate": 1e-3, "seed": 0},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "inPlace": False},
        "checkpoint": {"everySteps": 15, "keep": 3},
        "elastic": {"minWorkers": 1},
        "resources": {"gpusPerWorker": 0},
    },
}


@pytest.mark.process
def test_a_smaller_attempt_that_faults_where_more_fit_is_followed_by_the_larger_size(tmp_path: Path) -> None:
    # 1 worker fits at first (the 2-worker attempt cannot start), 2 from step 22; the 1-worker
    # attempt faults past step 25, before its checkpoint at 30 could grow it. The checkpoint at 15 is
    # told seven steps before 22: read late (its save is asynchronous) it would still stop no attempt.
    result, _ = run(tmp_path, "--plain", "--workers-available", "1,22:2", job=JOB)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [(a["precision"], a["worldSize"], a["reason"]) for a in report["attempts"]] == [
        ("fp16", 2, "ScaledDown"),
        ("fp16", 1, "NumericFault"),
        ("bf16", 2, "Succeeded"),
    ], result.stdout[-3000:]
    assert report["attempts"][2]["startStep"] == 15
