"""What an adapter reports for a step is the framework's own for that step. The loss, however
the step is split into micro-batches: a Hugging Face model that takes `num_items_in_batch`
(every causal LM) normalises each micro-batch's loss over the whole step, so the step's loss is
the sum of the micro-batches' (the Trainer's own log sums them too), not their mean. The
learning rate: the one the optimizer stepped with (Lightning steps a per-step schedule before
the batch ends). The samples: those the step trained on, also
at the end of an epoch whose last batch is short."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.adapter_jobs import SCRIPTS, command, job
from tests.unit.trainer.conftest import in_process_launch, run_trainer, spec
from tests.unit.trainer.test_adapters_arguments import Linear, Regression

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


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_the_samples_a_step_reports_are_those_it_trained_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    """20 samples in batches of 8: the third step trains on the epoch's last 4, and the data
    position (the samples behind samples/s, and a skipped step's count) is 20, not 3 x 8."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    x, y = torch.randn(20, 4), torch.randn(20)
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 3, "batchSize": 8, "seed": 0})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        if framework == "hf":
            data = [{"x": x[i], "labels": y[i]} for i in range(20)]
            trainer = Trainer(model=Regression(), args=mpjob_hf.training_arguments(run), train_dataset=data)  # type: ignore[arg-type]
            mpjob_hf.train(run, trainer)
        else:
            loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
            lightning = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False))
            mpjob_lightning.fit(run, lightning, Linear(), train_dataloaders=loader)
        seen = run.samples_seen
    finally:
        run.close()
    assert seen == 20


class Scheduled(Linear):
    """SGD at 1.0 times a per-step schedule of step + 1: step s (1-based) is taken at rate s."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step + 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def test_the_lightning_adapter_reports_the_learning_rate_the_step_was_taken_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Lightning steps a step-interval schedule before `on_train_batch_end`: the rate then is the
    next step's. The step's is the one its optimizer stepped with, as under HF and an SDK loop."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32)), 8)
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 3, "batchSize": 8, "logEvery": 1})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False))
        mpjob_lightning.fit(run, trainer, Scheduled(), train_dataloaders=loader)
    finally:
        run.close()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(e["step"], e["lr"]) for e in events if e["event"] == "step"] == [(1, 1.0), (2, 2.0), (3, 3.0)]


@pytest.mark.process
@pytest.mark.parametrize(("extra", "peak"), [((), 2e-3), (("--lr", "5e-3"), 5e-3)])
def test_the_lightning_example_takes_its_optimizer_from_the_spec(
    tmp_path: Path, extra: tuple[str, ...], peak: float
) -> None:
    """training.learningRate, weightDecay and warmupSteps drive the example's AdamW and schedule
    (its own --lr, when given, wins over learningRate)."""
    training = {"steps": 10, "learningRate": 2e-3, "weightDecay": 0.05, "warmupSteps": 4}
    example = job("lightning", *extra, training=training, checkpoint={"everySteps": 10})
    run = run_trainer(tmp_path, example, "fp32", argv=command("lightning", *extra)[1:])
    assert run.code == 0, run.stderr[-3000:]
    lrs = [(e["step"], e["lr"]) for e in run.of("step")]
    assert lrs and all(
        lr == pytest.approx(peak * min(1.0, s / 4) * 0.5 * (1 + math.cos(math.pi * (s - 1) / 10))) for s, lr in lrs
    )
    ckpt = torch.load(next((tmp_path / "ckpt").rglob("lightning.ckpt")), weights_only=False)
    assert {g["weight_decay"] for g in ckpt["optimizer_states"][0]["param_groups"]} == {0.05}
