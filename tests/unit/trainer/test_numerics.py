"""Precision behaviour of the real trainer: fault, fallback target, calibration, accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

OVERFLOWING = {
    "task": {
        "builtin": "gpt",
        "args": {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000, "overflowAtStep": 25},
    },
    "training": {"steps": 50, "batchSize": 4, "logEvery": 5, "learningRate": 1e-3},
}


@pytest.mark.process
def test_fp16_overflow_is_a_numeric_fault_naming_the_last_good_checkpoint(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING), "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    assert run.report is not None and run.report.reason == "NumericFault"
    ckpt = run.report.last_good_checkpoint
    assert ckpt is not None and ckpt.step == 20 and ckpt.precision == "fp16"
    assert Path(ckpt.path, "state.pt").exists()
    assert run.report.counters.non_finite_losses >= 3
    # No checkpoint was written from the faulted state.
    assert not (tmp_path / "ckpt" / "step-000000030").exists()


@pytest.mark.process
def test_the_same_workload_trains_to_the_end_in_bf16(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING), "bf16")
    assert run.code == 0, run.stderr
    steps = run.of("step")
    assert steps[-1]["step"] == 50 and all(isinstance(s["loss"], float) for s in steps)
    assert run.report is not None and run.report.last_good_checkpoint.step == 50


@pytest.mark.process
def test_stable_fp16_survives_loss_scale_calibration(tmp_path: Path) -> None:
    job = spec(precision={"mode": "fp16", "lossScale": {"init": 2.0**24}})
    run = run_trainer(tmp_path, job, "fp16")
    assert run.code == 0, run.stderr
    steps = run.of("step")
    assert steps[0]["overflowSteps"] > 0, "calibration should have skipped some steps"
    assert steps[-1]["lossScale"] < 2.0**24
    assert run.of("fault") == []


@pytest.mark.process
def test_gradient_accumulation_matches_one_big_batch(tmp_path: Path) -> None:
    import torch

    big = run_trainer(tmp_path / "big", spec(training={"steps": 3, "batchSize": 16, "gradAccumulation": 1}))
    acc = run_trainer(tmp_path / "acc", spec(training={"steps": 3, "batchSize": 4, "gradAccumulation": 4}))
    assert big.code == 0 and acc.code == 0, big.stderr + acc.stderr
    a = torch.load(tmp_path / "big" / "ckpt" / "step-000000003" / "state.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "acc" / "ckpt" / "step-000000003" / "state.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


@pytest.mark.process
def test_clipping_sees_unscaled_gradients(tmp_path: Path) -> None:
    job = spec(training={"steps": 5, "logEvery": 1})
    fp32 = run_trainer(tmp_path / "fp32", job, "fp32")
    fp16 = run_trainer(
        tmp_path / "fp16", spec(training={"steps": 5, "logEvery": 1}, precision={"mode": "fp16"}), "fp16"
    )
    assert fp32.code == 0 and fp16.code == 0
    g32, g16 = fp32.of("step")[0]["gradNorm"], fp16.of("step")[0]["gradNorm"]
    assert g16 == pytest.approx(g32, rel=0.05)  # not 65536 times larger


@pytest.mark.process
def test_auto_resolves_to_bf16_on_cpu(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(training={"steps": 2}), "auto")
    assert run.code == 0
    assert run.of("start")[0]["precision"] == "bf16"
