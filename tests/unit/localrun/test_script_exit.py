"""`mpjob run` of a script that ends itself with one of the codes only the session decides
(42 NumericFault, 44 Preempted, ...): a script's own `sys.exit(42)` is its failure, not a
precision's fault. It fell back fp16 -> bf16 -> fp32 before (`sys.exit(44)` was retried as a
preemption until the attempts ran out); now it is retried in the same precision and the job
fails after the same failure twice, the message naming the script's exit."""

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
