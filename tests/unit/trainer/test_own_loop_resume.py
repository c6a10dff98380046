"""Exact resume of your own code: examples/own-loop/train.py (its own model, AdamW, LambdaLR,
DataLoader with a worker) on the SDK, two ranks under the launcher, SIGKILLed mid-run and run
again, ends bit for bit where an uninterrupted run ends."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import warm
from tests.helpers import Meeting, wait_for
from tests.unit.trainer.conftest import launch_env, spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
STEPS = 300
COMMAND = [
    sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", "2", "--workers", "1", "--",
    sys.executable, str(Path(__file__).with_name("paced_script.py")), str(REPO / "examples" / "own-loop" / "train.py"),
    "--samples", "1024", "--hidden", "32", "--loader-workers", "1",
]  # fmt: skip


def start(
    meeting: Meeting, tmp: Path, job: dict[str, Any], precision: str, attempt: int, pace: float = 0.0
) -> warm.Popen:
    """The launcher's two ranks as attempt `attempt`, each optimizer step `pace` seconds longer."""
    extra = {"PACED_STEP_SECONDS": str(pace)}
    env = launch_env(tmp, job, precision, attempt=attempt, ckpt=tmp / "ckpt", name=f"report{attempt}.json", extra=extra)
    env.update(meeting(2))  # other workers rendezvous beside it
    return warm.Popen(COMMAND, env=env, stdout=warm.PIPE, stderr=warm.STDOUT, text=True)


def finish(proc: warm.Popen) -> None:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out[-3000:]


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """Every tensor and number of two checkpoints equal, bit for bit (RNG states included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.process
def test_own_loop_killed_and_rerun_ends_bit_identical(tmp_path: Path, precision: str, meeting: Meeting) -> None:
    job = spec(
        task={"command": COMMAND[COMMAND.index("--") + 1 :]},
        training={"steps": STEPS, "logEvery": 10, "seed": 1},
        precision={"mode": precision},
        checkpoint={"everySteps": 10, "keep": 3},
    )
    finish(start(meeting, tmp_path / "straight", job, precision, attempt=0))

    cut = tmp_path / "cut"
    # 20 ms a step (the other runs are not paced): the 290 steps after the first checkpoint last
    # 5.8 s, so the kill lands inside the run however late this test, starved, sends it.
    proc = start(meeting, cut, job, precision, attempt=0, pace=0.02)
    wait_for(lambda: list((cut / "ckpt").glob("step-*/manifest.json")), 120, interval=0.02, message="a checkpoint")
    proc.send_signal(signal.SIGKILL)  # the launcher; its ranks die with it
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (cut / "ckpt" / f"step-{STEPS:09d}").exists(), "killed before the end"
    finish(start(meeting, cut, job, precision, attempt=1))

    final = f"step-{STEPS:09d}/state.pt"
    straight = torch.load(tmp_path / "straight" / "ckpt" / final, weights_only=True)
    resumed = torch.load(cut / "ckpt" / final, weights_only=True)
    assert {"model", "optimizer", "scheduler", "data", "rng"} <= straight.keys()
    assert straight["data"]["batches"] == STEPS
    assert_identical(straight, resumed)
