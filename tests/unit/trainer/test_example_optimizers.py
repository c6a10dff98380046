"""The own-code examples (examples/own-loop, examples/fsdp) build their AdamW and schedule from
the job: training.learningRate, weightDecay and warmupSteps set them, as they set the builtin
loop's and the framework examples'; an example's own --lr, when given, wins over learningRate."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
#: Each example at its smallest, in this process's world of one (no DataLoader workers).
SCRIPTS = {
    "own-loop": [str(REPO / "examples/own-loop/train.py"), "--samples", "512", "--hidden", "32", "--loader-workers=0"],
    "fsdp": [str(REPO / "examples/fsdp/train.py"), "--layers", "1", "--width", "16", "--context", "8"],
}
STEPS, WARMUP = 10, 4


def _factor(example: str, step: int) -> float:
    """The learning rate's share of its peak for the optimizer step logged as `step`."""
    warm = min(1.0, step / WARMUP)
    return warm * 0.5 * (1 + math.cos(math.pi * (step - 1) / STEPS)) if example == "own-loop" else warm


@pytest.mark.parametrize("example", sorted(SCRIPTS))
@pytest.mark.parametrize(("extra", "peak"), [((), 2e-3), (("--lr", "5e-3"), 5e-3)])
@pytest.mark.process
def test_the_own_code_examples_take_their_optimizer_from_the_spec(
    tmp_path: Path, example: str, extra: tuple[str, ...], peak: float
) -> None:
    argv = [*SCRIPTS[example], *extra]
    training = {"steps": STEPS, "logEvery": 1, "learningRate": 2e-3, "weightDecay": 0.05, "warmupSteps": WARMUP}
    job = spec(task={"command": [sys.executable, *argv]}, training=training, checkpoint={"everySteps": STEPS})
    run = run_trainer(tmp_path, job, "fp32", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    lrs = [(e["step"], e["lr"]) for e in run.of("step")]
    assert lrs and all(lr == pytest.approx(peak * _factor(example, s)) for s, lr in lrs), lrs
    state = torch.load(tmp_path / "ckpt" / f"step-{STEPS:09d}" / "state.pt", weights_only=True)
    # run.adamw decays no bias or norm: their group's decay stays 0
    assert {g["weight_decay"] for g in state["optimizer"]["param_groups"]} == {0.05, 0.0}
