"""What an adapter reports for a step is the framework's own for that step. The loss, however
the step is split into micro-batches: a Hugging Face model that takes `num_items_in_batch`
(every causal LM) normalises each micro-batch's loss over the whole step, so the step's loss is
the sum of the micro-batches' (the Trainer's own log sums them too), not their mean. The
learning rate: the one the optimizer stepped with."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.adapter_jobs import SCRIPTS, job
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))  # HF's default schedule: linear to 0


def _losses(tmp: Path, framework: str, batch: int, accumulation: int) -> list[float]:
    extra = ["--dropout", "0"] if framework == "hf" else []
    training = {"steps": 10, "batchSize": batch, "gradAccumulation": accumulation}
    run = run_trainer(tmp, job(framework, *extra, training=training), "fp32", argv=[*SCRIPTS[framework], *extra])
    assert run.code == ExitCode.SUCCESS, run.stderr[-3000:]
    return [e["loss"] for e in run.of("step")]


@pytest.mark.parametrize("framework", ["hf", "lightning"])
@pytest.mark.process
def test_the_reported_loss_does_not_depend_on_gradient_accumulation(tmp_path: Path, framework: str) -> None:
    whole = _losses(tmp_path / "whole", framework, 8, 1)
    split = _losses(tmp_path / "split", framework, 4, 2)
    assert len(whole) == len(split) == 2
    assert split == pytest.approx(whole, rel=1e-3)


@pytest.mark.process
def test_the_hf_adapter_reports_the_learning_rate_the_step_was_taken_with(tmp_path: Path) -> None:
    """The Trainer steps its LR schedule after the optimizer, before the step's end: the step's
    rate is the one the optimizer stepped with, as the Trainer logs it and an SDK loop reports it."""
    argv = [SCRIPT, "hf"]
    job = spec(task={"command": [sys.executable, *argv]}, training={"steps": 30, "learningRate": 1e-3})
    run = run_trainer(tmp_path, job, "fp32", argv=argv)
    assert run.code == ExitCode.SUCCESS, run.stderr[-3000:]
    steps = run.of("step")
    assert steps and all(e["lr"] == pytest.approx(1e-3 * (1 - (e["step"] - 1) / 30)) for e in steps)
