"""`mpjob run` of an fp16 loop brought with its own GradScaler, kept beside the SDK's: it calls
`run.backward(own.scale(loss))`, which the attempt's GradScaler scales again, so its own
`scaler.step(optimizer)` finds inf every step and never steps; `run.step()` is never called. The
job ended Succeeded with no update applied and a final checkpoint claiming every step. Now the
attempt ends ConfigError at the first checkpoint step, before it is written, naming the scaler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.unit, pytest.mark.process]

MPJOB = Path(sys.executable).with_name("mpjob")

OWN_SCALER = """
import torch
from mpjob_trainer import session as mpjob

with mpjob.start() as run:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = run.resume(model=model, optimizer=optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(start, run.total_steps):
        with run.autocast():
            loss = model(torch.randn(4, 4)).float().square().mean() + 1.0
        run.backward(scaler.scale(loss))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        run.end_step(step + 1, loss=loss, samples=4)
"""


def test_an_fp16_loop_whose_own_scaler_swallows_every_step_does_not_succeed(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(OWN_SCALER)
    spec = {
        "task": {"command": ["python", "train.py"]},
        "training": {"steps": 8, "batchSize": 4, "logEvery": 2},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": 4},
        "resources": {"gpusPerWorker": 0},
    }
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "own"}, "spec": spec}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [str(MPJOB), "run", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out"), "--plain", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    said = result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert result.returncode == 1 and report["phase"] == "Failed", said
    attempts = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert attempts == [("fp16", "ConfigError")], said  # the script's fault: no fallback, no retry
    message = report["attempts"][0]["message"]
    assert "steps 1 to 4 each ran run.backward() and no optimizer stepped" in message
    assert "Remove your own torch.amp.GradScaler" in message
    assert report.get("lastCheckpoint") is None, report  # step 4's checkpoint would have claimed them
