"""A framework's model whose buffers an fp16 forward overflow made non-finite is never saved as
good: the adapters' checkpoints follow the SDK's rule (state.model_tensors, state.all_finite),
weights and floating-point buffers alike, and the precision ends at the first save that finds them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))
#: One fp16 forward overflow, at optimizer step 13 (1-based): its loss is NaN (one of the
#: three non-finite losses the guard allows), GradScaler skips it, BatchNorm keeps NaN statistics.
ARGS = ["--batchnorm", "--overflow-at", "12", "--overflow-until", "13"]


def saved_buffers(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The BatchNorm's running statistics in a framework checkpoint inside an mpjob checkpoint."""
    if (hf := next(checkpoint.glob("framework/**/model.safetensors"), None)) is not None:
        from safetensors.torch import load_file

        weights = load_file(hf)
    else:
        ckpt = next(checkpoint.glob("framework/**/*.ckpt"))
        weights = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    return {k: v for k, v in weights.items() if "running" in k}


@pytest.mark.parametrize("framework", ["hf", "lightning"])
@pytest.mark.process
def test_an_overflow_that_poisons_batchnorm_ends_the_precision_at_the_next_save(tmp_path: Path, framework: str) -> None:
    """Before, the adapters checked the parameters only: the checkpoints of steps 20 and 30 held NaN
    running statistics and the attempt ended Succeeded (exit 0) on a model whose evaluation is NaN."""
    job = spec(
        task={"command": [sys.executable, SCRIPT, framework, *ARGS]},
        training={"steps": 30, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3},
        precision={"mode": "fp16", "fallback": ["bf16"]},
    )
    run = run_trainer(tmp_path, job, "fp16", argv=[SCRIPT, framework, *ARGS])
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr[-3000:]
    assert run.report is not None and "buffers are non-finite at step 20" in run.report.message
    assert [e["step"] for e in run.of("checkpointSkipped")] == [20]
    assert max(e["step"] for e in run.of("step")) == 20  # nothing trained on from the poisoned state
    saved = sorted(p for p in (tmp_path / "ckpt").glob("step-*") if p.is_dir())
    assert [p.name for p in saved][-1] == "step-000000010"
    last = saved_buffers(saved[-1])
    assert last and all(torch.isfinite(t).all() for t in last.values())
