"""`mpjob run` of a script whose own doing ends the job, not a precision's fault: one that ends
itself with one of the codes only the session decides (42 NumericFault, 44 Preempted, ...): it fell
back fp16 -> bf16 -> fp32 before (`sys.exit(44)` was retried as a preemption until the attempts ran
out); now it is retried in the same precision and the job fails after the same failure twice, the
message naming the script's exit. And one whose own GradScaler swallows every step."""

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

#: Exits with CODE at step 7, after a checkpoint at step 4, whatever the attempt.
ENDS_AT_STEP_7 = """
import sys
import torch
from mpjob_trainer import session as mpjob

with mpjob.start() as run:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = run.resume(model=model, optimizer=optimizer)
    for step in range(start, run.total_steps):
        if step + 1 == 7:
            sys.exit(CODE)
        with run.autocast():
            loss = model(torch.randn(4, 4)).square().mean()
        run.backward(loss)
        run.step(optimizer)
        run.end_step(step + 1, loss=loss, samples=4)
"""

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


def run(tmp: Path, source: str) -> tuple[int, dict[str, Any], str]:
    """`mpjob run` of `python train.py` (the source given) in fp16 with a ladder to fp32."""
    (tmp / "train.py").write_text(source)
    spec = {
        "task": {"command": ["python", "train.py"]},
        "training": {"steps": 10, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": 4},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"maxAttempts": 4},
    }
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "own"}, "spec": spec}
    (tmp / "job.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(
        [str(MPJOB), "run", str(tmp / "job.yaml"), "--out", str(tmp / "out"), "--plain", "--no-plot"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


@pytest.mark.parametrize("code", [42, 44])
def test_a_scripts_own_exit_with_a_session_code_is_its_failure(tmp_path: Path, code: int) -> None:
    status, report, said = run(tmp_path, ENDS_AT_STEP_7.replace("CODE", str(code)))
    assert status == 1 and report["phase"] == "Failed", said
    attempts = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert attempts == [("fp16", "InfraError"), ("fp16", "InfraError")], said  # no fallback, no resume loop
    assert f"the script exited with code {code} (sys.exit({code}))" in report["attempts"][0]["message"]
    failed = next(c for c in report["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailedAtTheSameStep", failed


def test_an_exit_42_without_the_session_is_no_numeric_fault(tmp_path: Path) -> None:
    status, report, said = run(tmp_path, "import sys\nsys.exit(42)\n")
    assert status == 1 and report["phase"] == "Failed", said
    assert {(a["precision"], a["reason"]) for a in report["attempts"]} == {("fp16", "InfraError")}, said
    assert "exited 42 without a termination report" in report["attempts"][0]["message"]
    assert "the script's own exit" in report["attempts"][0]["message"]


def test_an_fp16_loop_whose_own_scaler_swallows_every_step_does_not_succeed(tmp_path: Path) -> None:
    """It calls `run.backward(own.scale(loss))`, which the attempt's GradScaler scales again, so its
    own `scaler.step(optimizer)` finds inf every step and never steps; `run.step()` is never called.
    The job ended Succeeded with no update applied and a final checkpoint claiming every step. Now
    the attempt ends ConfigError at the first checkpoint step, before it is written, naming the scaler."""
    status, report, said = run(tmp_path, OWN_SCALER)
    assert status == 1 and report["phase"] == "Failed", said
    attempts = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert attempts == [("fp16", "ConfigError")], said  # the script's fault: no fallback, no retry
    message = report["attempts"][0]["message"]
    assert "steps 1 to 4 each ran run.backward() and no optimizer stepped" in message
    assert "Remove your own torch.amp.GradScaler" in message
    assert report.get("lastCheckpoint") is None, report  # step 4's checkpoint would have claimed them
