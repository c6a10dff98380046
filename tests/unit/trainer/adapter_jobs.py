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
#: Put before a script, paces its optimizer steps by $PACED_STEP_SECONDS (a test stops it mid-way).
PACED = str(Path(__file__).with_name("paced_script.py"))
#: The file in each framework's checkpoint a test may corrupt: the weights.
WEIGHTS = {"hf": "model.safetensors", "lightning": "lightning.ckpt"}
FRAMEWORKS = sorted(SCRIPTS)


def command(framework: str, *extra: str, paceable: bool = False) -> list[str]:
    """The example's command; `paceable`: run by paced_script.py (paced only where the environment says)."""
    return [sys.executable, *([PACED] if paceable else []), *SCRIPTS[framework], *extra]


def job(
    framework: str, *extra: str, training: dict[str, Any] | None = None, paceable: bool = False, **over: Any
) -> dict[str, Any]:
    """A task.command job of the example (spec fields as in conftest.spec; `training` merged)."""
    settings = {"steps": 30, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3, **(training or {})}
    return spec(task={"command": command(framework, *extra, paceable=paceable)}, training=settings, **over)
