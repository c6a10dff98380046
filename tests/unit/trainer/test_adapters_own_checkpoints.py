"""A script's own "best model" checkpoints under the adapters: a Hugging Face Trainer that saves
(`save_strategy="steps"`, `load_best_model_at_end`) and a Lightning `ModelCheckpoint(monitor=...,
save_top_k=1)` train and write them where the script asked, beside mpjob's own, which stay whole
(the optimizer too, under `save_only_model`) and the only ones resumed from; a folder inside
mpjob's checkpoint folder is refused, naming the field. The framework's best-model tracking is in
mpjob's checkpoint (the Trainer's `trainer_state.json`, Lightning's callback states), so an
attempt that resumes after a fallback carries it on."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_arguments import Regression

pytestmark = pytest.mark.unit

JOB = {"steps": 12, "batchSize": 4, "logEvery": 2, "seed": 0, "learningRate": 1e-2}
FALLBACK = {"mode": "bf16", "fallback": ["fp32"]}


def _samples(count: int, seed: int) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(count, 4, generator=generator)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    return [{"x": x[i], "labels": y[i]} for i in range(count)]


def _hf_train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, **given: Any) -> Any:
    """An attempt of the job under `train`, its Trainer's arguments from `training_arguments`
    (`given` on top); returns the Trainer."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint={"everySteps": 4})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    try:
        args = mpjob_hf.training_arguments(run, **given)
        trainer = Trainer(model=Regression(), args=args, train_dataset=_samples(64, 0), eval_dataset=_samples(16, 1))
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    return trainer


def _best_model(out: Path, **more: Any) -> dict[str, Any]:
    return {
        "output_dir": str(out),
        "save_strategy": "steps",
        "save_steps": 3,
        "eval_strategy": "steps",
        "eval_steps": 3,
        "load_best_model_at_end": True,
        "metric_for_best_model": "loss",
        **more,
    }


def _mpjobs(tmp_path: Path) -> dict[int, Path]:
    """mpjob's checkpoints of the job: step -> the framework's folder in it."""
    return {int(f.parent.name.split("-")[1]): f for f in (tmp_path / "ckpt").glob("**/step-*/framework")}


def test_an_hf_trainer_that_keeps_its_best_model_writes_it_to_its_output_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, save_strategy was the attempt's: the script had to drop the saves its deliverable is."""
    out = tmp_path / "out"
    trainer = _hf_train(tmp_path, monkeypatch, "fp32", **_best_model(out, save_only_model=True, save_total_limit=1))
    evals = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    best = min(evals, key=evals.__getitem__)
    assert sorted(evals) == [3, 6, 9, 12] and trainer.state.best_global_step == best
    assert trainer.state.best_model_checkpoint == str(out / f"checkpoint-{best}")
    kept = out / f"checkpoint-{best}"
    assert (kept / "model.safetensors").exists() and not (
        kept / "optimizer.pt"
    ).exists()  # the script's save_only_model
    from safetensors.torch import load_file

    held = trainer.model.state_dict()  # load_best_model_at_end: the best checkpoint's weights
    assert all(torch.equal(w, held[k]) for k, w in load_file(kept / "model.safetensors").items())
    mpjobs = _mpjobs(tmp_path)
    assert sorted(mpjobs) == [0, 4, 8, 12]
    assert all((f / "optimizer.pt").exists() for f in mpjobs.values())  # mpjob's stay whole
    assert not [p for p in (tmp_path / "ckpt").rglob("checkpoint-*") if p.parent.name != "framework"]


def test_an_hf_trainers_best_model_is_carried_into_the_fallback_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback attempt resumes from mpjob's step-8 checkpoint, whose trainer state holds the
    best of the evaluations at steps 3 and 6. Measured with greater_is_better, the first
    evaluation is the best of all (the loss falls): only a carried best names it at the end."""
    out = tmp_path / "out"
    _hf_train(tmp_path, monkeypatch, "bf16", **_best_model(out, greater_is_better=True))
    first = sorted(_mpjobs(tmp_path))
    shutil.rmtree(_mpjobs(tmp_path)[12].parent)  # the fault came after step 8's checkpoint
    trainer = _hf_train(tmp_path, monkeypatch, "fp32", **_best_model(out, greater_is_better=True))
    evals = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    assert first == [0, 4, 8, 12] and sorted(evals) == [3, 6, 9, 12]  # the history carried too
    assert max(evals, key=evals.__getitem__) == 3  # not carried, the best would be step 9's
    assert (trainer.state.best_global_step, trainer.state.best_model_checkpoint) == (3, str(out / "checkpoint-3"))


@pytest.mark.parametrize("inside", ["", "sub/out", ".hf-output"])
def test_an_hf_output_dir_inside_mpjobs_checkpoint_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _hf_train(tmp_path, monkeypatch, "fp32", **_best_model(tmp_path / "ckpt" / inside))
    assert "TrainingArguments(output_dir)" in str(refused.value) and "mpjob's checkpoint folder" in str(refused.value)
    assert not list(tmp_path.rglob("checkpoint-*"))  # refused before the Trainer trained or saved


class Fitted(L.LightningModule):
    """A linear regression that logs its validation loss, for a ModelCheckpoint to monitor."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.linear(batch["x"]).squeeze(-1), batch["labels"])

    def validation_step(self, batch: Any, index: int) -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(self.linear(batch["x"]).squeeze(-1), batch["labels"])
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def _lightning_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, dirpath: Path) -> Any:
    """An attempt of the job under `fit`, the script's ModelCheckpoint keeping its best model in
    `dirpath`; returns that ModelCheckpoint."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint={"everySteps": 4})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    best = ModelCheckpoint(dirpath=str(dirpath), monitor="val_loss", mode="max", save_top_k=1)
    loader = torch.utils.data.DataLoader(_samples(64, 0), batch_size=4)
    settings = mpjob_lightning.trainer_settings(run, callbacks=[best], logger=False, val_check_interval=3)
    try:
        trainer = L.Trainer(default_root_dir=str(tmp_path / "root"), **settings)
        val = torch.utils.data.DataLoader(_samples(16, 1), batch_size=8)
        mpjob_lightning.fit(run, trainer, Fitted(), train_dataloaders=loader, val_dataloaders=val)
    finally:
        run.close()
    return best


def test_a_lightning_model_checkpoint_keeps_its_best_model_and_carries_it_into_the_fallback_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a ModelCheckpoint was refused. Its state is in mpjob's checkpoint (Lightning saves
    callbacks' states): the fallback attempt, from step 8, keeps the best of the validations at
    steps 3 and 6. Monitored with mode="max", the first validation is the best (the loss falls)."""
    out = tmp_path / "best"
    first = _lightning_fit(tmp_path, monkeypatch, "bf16", out)
    assert [p.name for p in out.iterdir()] == [Path(first.best_model_path).name]  # save_top_k=1
    assert Path(first.best_model_path).name == "epoch=0-step=3.ckpt"
    saved = torch.load(first.best_model_path, weights_only=False)
    assert saved["global_step"] == 3 and "state_dict" in saved
    mpjobs = _mpjobs(tmp_path)
    assert sorted(mpjobs) == [0, 4, 8, 12] and not list((tmp_path / "ckpt").rglob("*step=*.ckpt"))
    shutil.rmtree(mpjobs[12].parent)  # the fault came after step 8's checkpoint
    again = _lightning_fit(tmp_path, monkeypatch, "fp32", out)
    assert (again.best_model_path, again.best_model_score) == (first.best_model_path, first.best_model_score)
    assert [p.name for p in out.iterdir()] == ["epoch=0-step=3.ckpt"]


@pytest.mark.parametrize("inside", ["", "sub/best"])
def test_a_lightning_model_checkpoint_inside_mpjobs_checkpoint_folder_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inside: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        _lightning_fit(tmp_path, monkeypatch, "fp32", tmp_path / "ckpt" / inside)
    assert "ModelCheckpoint(dirpath)" in str(refused.value) and "mpjob's checkpoint folder" in str(refused.value)
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before Lightning trained or saved
