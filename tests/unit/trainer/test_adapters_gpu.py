"""On a CUDA machine: both frameworks' own fp16 path (CUDA autocast, the attempt's GradScaler
as the framework's) meets the injected overflow and ends NumericFault; bf16 trains through
(skipped without CUDA; on a CPU test_adapters_recovery covers the same story)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.trainer.adapter_jobs import FRAMEWORKS, command, job
from tests.unit.trainer.conftest import run_trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.unit,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fp16_on_cuda_overflows_into_a_numeric_fault(tmp_path: Path, framework: str) -> None:
    spec = job(framework, "--overflow-at", "12", precision={"mode": "fp16"}, resources={"gpusPerWorker": 1})
    run = run_trainer(tmp_path, spec, "fp16", argv=command(framework, "--overflow-at", "12")[1:])
    assert run.code == 42, run.stderr[-3000:]
    assert run.of("start")[0]["device"].startswith("cuda")
    assert run.report is not None and run.report.last_good_checkpoint is not None
    assert run.report.last_good_checkpoint.step == 10 and run.report.counters.overflow_steps > 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_bf16_on_cuda_trains_through(tmp_path: Path, framework: str) -> None:
    spec = job(framework, precision={"mode": "bf16"}, resources={"gpusPerWorker": 1})
    run = run_trainer(tmp_path, spec, "bf16", argv=command(framework)[1:])
    assert run.code == 0, run.stderr[-3000:]
    assert run.of("step")[-1]["step"] == 30 and run.of("step")[-1]["precision"] == "bf16"
