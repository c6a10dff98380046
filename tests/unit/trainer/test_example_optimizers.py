"""The own-code examples (examples/own-loop, examples/fsdp, examples/tutorial and the complete
example in docs/sdk.md) build their AdamW and schedule from the job: training.learningRate,
weightDecay and warmupSteps set them, as they set the builtin loop's and the framework
examples'; an example's own --lr, when given, wins over learningRate."""

from __future__ import annotations

import math
import re
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
#: The scripts a newcomer copies: no --lr of their own.
TAUGHT = {
    "tutorial": [str(REPO / "examples/tutorial/train.py"), "--samples", "512", "--hidden", "32"],
    "sdk-docs": ["train.py"],  # docs/sdk.md's complete example, written into the test's folder
}
#: Those with a cosine after the warm-up (the others warm up, then hold the peak).
COSINE = {"own-loop", "sdk-docs"}
STEPS, WARMUP = 10, 4
CASES = [
    *((example, extra, peak) for example in sorted(SCRIPTS) for extra, peak in [((), 2e-3), (("--lr", "5e-3"), 5e-3)]),
    *((example, (), 2e-3) for example in sorted(TAUGHT)),
]


def _factor(example: str, step: int) -> float:
    """The learning rate's share of its peak for the optimizer step logged as `step`."""
    warm = min(1.0, step / WARMUP)
    return warm * 0.5 * (1 + math.cos(math.pi * (step - 1) / STEPS)) if example in COSINE else warm


def _argv(example: str, folder: Path) -> list[str]:
    if example == "sdk-docs":
        blocks = re.findall(r"```python\n(.*?)```", (REPO / "docs/sdk.md").read_text(), re.S)
        (folder / "train.py").write_text(next(b for b in blocks if "__main__" in b and "Sampler" in b))
        return [str(folder / "train.py")]
    return {**SCRIPTS, **TAUGHT}[example]


@pytest.mark.parametrize(("example", "extra", "peak"), CASES)
@pytest.mark.process
def test_the_own_code_examples_take_their_optimizer_from_the_spec(
    tmp_path: Path, example: str, extra: tuple[str, ...], peak: float
) -> None:
    argv = [*_argv(example, tmp_path), *extra]
    training = {"steps": STEPS, "logEvery": 1, "learningRate": 2e-3, "weightDecay": 0.05, "warmupSteps": WARMUP}
    job = spec(task={"command": [sys.executable, *argv]}, training=training, checkpoint={"everySteps": STEPS})
    run = run_trainer(tmp_path, job, "fp32", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    lrs = [(e["step"], e["lr"]) for e in run.of("step")]
    assert lrs and all(lr == pytest.approx(peak * _factor(example, s)) for s, lr in lrs), lrs
    state = torch.load(tmp_path / "ckpt" / f"step-{STEPS:09d}" / "state.pt", weights_only=True)
    # run.adamw decays no bias or norm: their group's decay stays 0
    assert {g["weight_decay"] for g in state["optimizer"]["param_groups"]} == {0.05, 0.0}
