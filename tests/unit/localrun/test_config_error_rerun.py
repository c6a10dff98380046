"""`mpjob run` of a script that ends on a configuration error (exit 43), fixed and run again with
the same --out: the rerun was refused ("report.json says this run already ended Failed; use
--fresh"), and --fresh threw away every checkpoint the run made. Now the fixed rerun goes on from
the newest checkpoint; a fix that changes what the checkpoints bind is still refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = [pytest.mark.unit, pytest.mark.process]

MPJOB = Path(sys.executable).with_name("mpjob")

#: Trains 10 steps, a checkpoint every 4; records where each attempt started. BROKEN: the line
#: that makes it a configuration error at step 7 (the fix deletes it).
SCRIPT = """
import torch
from mpjob_trainer import session as mpjob

with mpjob.start() as run:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = run.resume(model=model, optimizer=optimizer)
    with open("starts.txt", "a") as starts:
        starts.write(f"{start}\\n")
    for step in range(start, run.total_steps):
        BROKEN
        with run.autocast():
            loss = model(torch.randn(4, 4)).square().mean()
        run.backward(loss)
        run.step(optimizer)
        run.end_step(step + 1, loss=loss, samples=4)
"""
BROKEN = 'if step + 1 == 7: raise mpjob.ConfigError("args.lr: 0.1 is not what this model trains with")'


def job(tmp: Path, batch_size: int = 4) -> Path:
    spec = {
        "task": {"command": ["python", "train.py"]},
        "training": {"steps": 10, "batchSize": batch_size, "logEvery": 5},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "checkpoint": {"everySteps": 4},
        "resources": {"gpusPerWorker": 0},
    }
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "own"}, "spec": spec}
    path = tmp / f"job-{batch_size}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(tmp: Path, manifest: Path) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [str(MPJOB), "run", str(manifest), "--out", str(tmp / "out"), "--plain", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


def test_a_run_fixed_after_its_configuration_error_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT.replace("BROKEN", BROKEN))
    code, failed, said = run(tmp_path, job(tmp_path))
    assert code == 1 and failed["phase"] == "Failed", said
    assert [(a["reason"], a["startStep"]) for a in failed["attempts"]] == [("ConfigError", 0)], said
    assert failed["lastCheckpoint"]["step"] == 4, failed
    assert "rerun:  fix the configuration error and run `mpjob run` again with the same --out; " in said, said
    assert "it resumes from checkpoint step 4" in said, said

    # A "fix" that changes the samples per step: the checkpoints hold to them, refused before anything runs.
    code, kept, said = run(tmp_path, job(tmp_path, batch_size=8))
    assert code == 2 and "spec.training.batchSize" in said, said
    assert kept == failed

    (tmp_path / "train.py").write_text(SCRIPT.replace("BROKEN", "pass"))
    code, report, said = run(tmp_path, job(tmp_path))
    assert code == 0 and report["phase"] == "Succeeded" and report["step"] == 10, said
    assert f"rerunning own in {tmp_path / 'out'} after its configuration error, from checkpoint step 4" in said, said
    ended = [(a["index"], a["precision"], a["reason"], a["startStep"], a["endStep"]) for a in report["attempts"]]
    assert ended == [(0, "bf16", "ConfigError", 0, 6), (1, "bf16", "Succeeded", 4, 10)], said
    assert (tmp_path / "starts.txt").read_text().split() == ["0", "4"]  # the trainer restored step 4
    assert [c["status"] for c in report["conditions"] if c["type"] == "Failed"] in ([], ["False"]), report
    assert "rerun:" not in said, said

    # Any other ending is left as it ended.
    code, again, said = run(tmp_path, job(tmp_path))
    assert code == 0 and again == report and "already ended Succeeded; use --fresh" in said, said
