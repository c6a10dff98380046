"""The two framework examples as tiny test jobs: commands, specs and a way to run an attempt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tests.unit.trainer.conftest import spec

REPO = Path(__file__).resolve().parents[3]
#: Each example at its smallest: a GPT-2 of one block, a classifier of 32 hidden units.
SCRIPTS = {
    "hf": [str(REPO / "examples/hf-trainer/train.py"), "--layers", "1", "--embd", "32", "--samples", "512"],
    "lightning": [str(REPO / "examples/lightning/train.py"), "--hidden", "32", "--samples", "1024"],
}
#: The file in each framework's checkpoint a test may corrupt: the weights.
WEIGHTS = {"hf": "model.safetensors", "lightning": "lightning.ckpt"}
FRAMEWORKS = sorted(SCRIPTS)


def command(framework: str, *extra: str) -> list[str]:
    return [sys.executable, *SCRIPTS[framework], *extra]


def job(framework: str, *extra: str, training: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    """A task.command job of the example (spec fields as in conftest.spec; `training` merged)."""
    settings = {"steps": 30, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3, **(training or {})}
    return spec(task={"command": command(framework, *extra)}, training=settings, **over)
