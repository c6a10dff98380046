"""On a CUDA machine: test_in_place's story (fp16 overflows, bf16 goes on in the same process
from the last checkpoint), eager and compiled: every bf16 step after the change is finite. On an
H200 (torch 2.11) the quickstart's bf16 attempt after its in-place change read non-finite
losses: torch 2.11's AOTAutograd cache served the graph compiled for fp16 to bf16, which
mpjob_trainer.speed now turns off on such a torch (docs/benchmarks.md, "The first run on a
GPU"); skipped without CUDA."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec
from tests.unit.trainer.test_numerics import OVERFLOWING

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.unit,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("compile_mode", ["never", "always"])
def test_bf16_after_an_in_place_change_from_fp16_trains_finitely_on_cuda(tmp_path: Path, compile_mode: str) -> None:
    job = spec(
        **OVERFLOWING,
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]},
        resources={"gpusPerWorker": 1},
    )
    job["training"] = {**job["training"], "compile": compile_mode}
    run = run_trainer(tmp_path, job, "fp16", in_place_to=["bf16", "fp32"])
    assert run.of("start")[0]["device"].startswith("cuda")
    (changed, *later) = run.of("precisionChanged")
    assert changed["toPrecision"] == "bf16" and later == [], run.of("precisionChanged")
    bf16 = [e["loss"] for e in run.of("step") if e["precision"] == "bf16"]
    assert bf16 and all(math.isfinite(loss) for loss in bf16), bf16
    assert run.code == ExitCode.SUCCESS, run.stderr[-3000:]
