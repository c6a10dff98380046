"""The loss an adapter reports for a step is the framework's own for that step, however the
step is split into micro-batches: a Hugging Face model that takes `num_items_in_batch` (every
causal LM) normalises each micro-batch's loss over the whole step, so the step's loss is the
sum of the micro-batches' (the Trainer's own log sums them too), not their mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.adapter_jobs import SCRIPTS, job
from tests.unit.trainer.conftest import run_trainer

pytestmark = pytest.mark.unit


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
