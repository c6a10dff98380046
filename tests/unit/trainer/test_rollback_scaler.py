"""A rollback in place gives fp16's GradScaler the state a restarted attempt would start from: the
checkpoint's calibrated scale when it was written in fp16, else a fresh one (a checkpoint written
in another precision holds none), never the scale the rolled-back steps backed off to."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from mpjob_contract.codes import ExitCode
from mpjob_trainer.data import StepSampler
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("quarantine_script.py"))
ARGS = {"inputs": 8, "hidden": 16, "samples": 512}
TRAINING = {"steps": 30, "batchSize": 8, "logEvery": 5, "learningRate": 1e-2, "seed": 3}


def job(poison: int) -> dict:
    task = {"builtin": "mlp", "args": {**ARGS, "nonFiniteSamples": [poison]}}
    return spec(task=task, training=TRAINING, precision={"mode": "fp16", "fallback": ["bf16", "fp32"]})


def scaler_at(ckpt: Path, step: int) -> dict:
    return torch.load(ckpt / f"step-{step:09d}" / "state.pt", weights_only=True)["scaler"]


def resumed(tmp: Path, name: str) -> str:
    return str(tmp / name / "ckpt" / "step-000000010")


@pytest.mark.process
def test_a_rollback_to_a_checkpoint_of_another_precision_starts_fp16s_scale_afresh(tmp_path: Path) -> None:
    # A bf16 attempt's checkpoint at step 10 (no GradScaler state), then an fp16 attempt resumed from it
    # meets a poisoned sample at step 15: GradScaler skips that step and halves its scale, the data rung
    # rolls back to step 10 and skips the sample. A straight fp16 attempt from the same checkpoint whose
    # data never held the sample starts from a fresh scale: the rolled-back one must end as it does.
    (poison,) = StepSampler(ARGS["samples"], 8, 1, 1, 0, TRAINING["seed"]).indices(15, 0)[:1]
    base = run_trainer(tmp_path / "base", job(poison), "bf16")
    assert base.code == ExitCode.SUCCESS, base.stderr
    for name in ("skipped", "straight"):  # each attempt resumes from its own checkpoint folder
        shutil.copytree(tmp_path / "base" / "ckpt" / "step-000000010", tmp_path / name / "ckpt" / "step-000000010")
    skipped = run_trainer(
        tmp_path / "skipped", job(poison), "fp16", attempt=1, resume_from=resumed(tmp_path, "skipped")
    )
    assert skipped.code == ExitCode.SUCCESS, skipped.stderr
    assert [e["steps"] for e in skipped.of("dataSkipped")] == [[15]]
    extra = {"QUARANTINED": str(poison), "PYTHONPATH": os.pathsep.join(sys.path)}
    straight = run_trainer(
        tmp_path / "straight",
        job(poison),
        "fp16",
        attempt=1,
        resume_from=resumed(tmp_path, "straight"),
        argv=[SCRIPT],
        extra=extra,
    )
    assert straight.code == ExitCode.SUCCESS, straight.stderr
    assert straight.of("dataSkipped") == []
    for step in (20, 30):
        assert scaler_at(tmp_path / "skipped" / "ckpt", step) == scaler_at(tmp_path / "straight" / "ckpt", step)
