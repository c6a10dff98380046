"""runPolicy's deadlines through `mpjob run`. progressDeadlineSeconds: an attempt whose data
loader hangs at step 25 (worker 0 prints no further step line) is stopped once its step has stood
still 30 s, its workers SIGTERMed and then SIGKILLed (the hung rank cannot act on SIGTERM), and
ends Stalled, charged; the next attempt goes on in the same precision from the step-20 checkpoint
to Succeeded, as through the operator (tests/integration/operator/test_progress_deadline.py).
activeDeadlineSeconds: an attempt still training when it passes is stopped (SIGTERM: the
trainer checkpoints) and the job ends Failed, DeadlineExceeded, as the operator ends it, its
lastCheckpoint the one written on SIGTERM."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests import warm
from tests.helpers import NO_PLOT
from tests.unit.localrun.stall_task import SPEC, stalled_then_retried

pytestmark = [pytest.mark.unit, pytest.mark.process]

JOB = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "hung"}, "spec": SPEC}


def test_a_local_attempt_whose_step_stands_still_past_its_deadline_is_stopped_and_retried(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(JOB))
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"})
    command = [sys.executable, "-m", "mpjob.cli", "run", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out")]
    result = warm.run([*command, *NO_PLOT], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    stalled_then_retried(json.loads((tmp_path / "out" / "report.json").read_text()), "worker 0's step lines")


def test_a_local_run_past_its_active_deadline_is_stopped_and_fails(tmp_path: Path) -> None:
    spec = {
        "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256}},
        "training": {"steps": 10_000_000, "batchSize": 4, "logEvery": 100},  # hours: the deadline ends it
        "precision": {"mode": "bf16"},
        "checkpoint": {"everySteps": 1000},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"activeDeadlineSeconds": 10},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**JOB, "metadata": {"name": "late"}, "spec": spec}))
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"})
    command = [sys.executable, "-m", "mpjob.cli", "run", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out")]
    result = warm.run([*command, *NO_PLOT], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    status = json.loads((tmp_path / "out" / "report.json").read_text())
    (attempt,) = status["attempts"]
    assert (status["phase"], attempt["reason"], attempt["finishTime"] is not None) == (
        "Failed",
        "DeadlineExceeded",
        True,
    )
    assert "runPolicy.activeDeadlineSeconds" in status["message"], status["message"]
    # Where its trainer stopped, and the checkpoint it wrote on SIGTERM (between the periodic ones).
    ckpt = status["lastCheckpoint"]
    assert ckpt is not None and ckpt["step"] == attempt["endStep"] == status["step"] > 0, status
    assert ckpt["step"] % 1000 != 0 and Path(ckpt["path"]).exists(), ckpt
