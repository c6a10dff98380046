"""On a CUDA machine: the trainer's fp16 and bf16 paths run on the GPU (skipped without CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = [pytest.mark.gpu, pytest.mark.unit]


@pytest.mark.parametrize("precision", ["fp16", "bf16", "auto"])
def test_trains_on_cuda(tmp_path: Path, precision: str) -> None:
    job = spec(precision={"mode": "fp16" if precision == "fp16" else "bf16"}, resources={"gpusPerWorker": 1})
    run = run_trainer(tmp_path, job, precision)
    assert run.code == 0, run.stderr
    start = run.of("start")[0]
    assert start["device"].startswith("cuda")
    assert start["precision"] in ("fp16", "bf16")
    assert run.of("step")[-1]["step"] == 30
