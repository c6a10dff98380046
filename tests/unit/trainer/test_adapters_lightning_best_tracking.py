"""A Lightning script's best-model tracking (a ModelCheckpoint monitoring val_loss, EarlyStopping)
through a fallback: mpjob's checkpoint of a step Lightning validates holds that validation (the
save follows it), so the fallback attempt carries the best model and the early-stopping patience
on from it as one uninterrupted run would."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_own_checkpoints import FALLBACK, Fitted, _mpjobs, _samples

pytestmark = pytest.mark.unit

JOB = {"steps": 16, "batchSize": 4, "logEvery": 2, "seed": 0, "learningRate": 1e-2}


def _fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, model: Fitted | None = None
) -> tuple[L.Trainer, Any, Any]:
    """An attempt of the job: Lightning validates every 4 steps, where mpjob checkpoints; the
    ModelCheckpoint keeps the greatest val_loss (the loss falls: the first validation is the
    best) and EarlyStopping, patience 2, stops at the second one after it. Returns the Trainer,
    the ModelCheckpoint and the EarlyStopping."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint={"everySteps": 4})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    best = ModelCheckpoint(dirpath=str(tmp_path / "best"), monitor="val_loss", mode="max", save_top_k=1)
    early = EarlyStopping(monitor="val_loss", mode="max", patience=2)
    loader = torch.utils.data.DataLoader(_samples(64, 0), batch_size=4)
    settings = mpjob_lightning.trainer_settings(run, callbacks=[best, early], logger=False, val_check_interval=4)
    try:
        trainer = L.Trainer(default_root_dir=str(tmp_path / "root"), **settings)
        val = torch.utils.data.DataLoader(_samples(16, 1), batch_size=8)
        fitted = model if model is not None else Fitted()
        mpjob_lightning.fit(run, trainer, fitted, train_dataloaders=loader, val_dataloaders=val)
    finally:
        run.close()
    return trainer, best, early


def test_mpjobs_checkpoint_of_a_validated_step_holds_that_validation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the step-8 checkpoint was written at the batch end, before step 8's validation:
    the fallback attempt from it never validated step 8, its EarlyStopping counted from step 4's
    and it trained on to step 16; now it stops at step 12, as the run without a fault did."""
    trainer, best, early = _fit(tmp_path, monkeypatch, "bf16")
    assert (trainer.global_step, early.wait_count, Path(best.best_model_path).name) == (12, 2, "epoch=0-step=4.ckpt")
    saved = torch.load(_mpjobs(tmp_path)[8] / "lightning.ckpt", weights_only=False)
    (stopping,) = [state for name, state in saved["callbacks"].items() if name.startswith("EarlyStopping")]
    assert stopping["wait_count"] == 1  # step 8's validation: one worse than step 4's
    for step, folder in _mpjobs(tmp_path).items():
        if step > 8:  # the fault came after mpjob's checkpoint of step 8
            shutil.rmtree(folder.parent)
    again, best_again, early_again = _fit(tmp_path, monkeypatch, "fp32")
    assert (again.global_step, early_again.wait_count) == (12, 2)
    assert (best_again.best_model_path, best_again.best_model_score) == (best.best_model_path, best.best_model_score)


def test_a_retry_of_a_fit_that_stopped_early_trains_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EarlyStopping stops the fit after step 12 (of 16). Before, a retry (the attempt crashed after
    step 12's checkpoint) counted the run done only at step 16: it resumed at step 12 and, Lightning
    forgetting its stop when fit begins, trained on to step 16 past the user's stop. Now step 12's
    checkpoint records the stop: the retry trains nothing and leaves the model as the fit ended."""
    import json

    from mpjob_trainer.adapters.reload import lightning_finished

    trainer, _, _ = _fit(tmp_path, monkeypatch, "bf16")
    assert trainer.global_step == 12 and max(_mpjobs(tmp_path)) == 12
    model = Fitted()
    again, _, _ = _fit(tmp_path, monkeypatch, "fp32", model)
    assert again.global_step == 12  # as the fit ended; it trained nothing (no later checkpoint, the weights below)
    assert max(_mpjobs(tmp_path)) == 12
    retried = json.loads((tmp_path / "report.json").read_text())
    assert (retried["reason"], retried["step"], retried["startStep"]) == ("Succeeded", 12, 12)
    assert "stopped early" in retried["message"]
    stopped = Fitted()
    lightning_finished(stopped, [], _mpjobs(tmp_path)[12], lambda path: torch.load(path, weights_only=False))
    assert all(torch.equal(w, model.state_dict()[k]) for k, w in stopped.state_dict().items())


def test_a_retry_of_a_finished_fit_leaves_its_callbacks_as_the_fit_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry of a run whose last step is checkpointed (the attempt crashed in the script's code
    after fit) trains nothing. Before, it read the weights alone: the ModelCheckpoint had no best
    model (`trainer.test(ckpt_path="best")` raised, failing the retry) and EarlyStopping no count.
    Now each callback's state comes back from the checkpoint, and the fit loop's progress (global_step
    read 0), as Lightning's own resume restores them."""
    trainer, best, early = _fit(tmp_path, monkeypatch, "bf16")
    assert trainer.global_step == 12 and Path(best.best_model_path).is_file()
    again, best_again, early_again = _fit(tmp_path, monkeypatch, "fp32")
    assert again.checkpoint_callback is best_again  # what `trainer.test(ckpt_path="best")` reads
    assert (again.global_step, again.current_epoch) == (trainer.global_step, trainer.current_epoch) == (12, 1)
    assert (best_again.best_model_path, best_again.best_model_score) == (best.best_model_path, best.best_model_score)
    assert (early_again.wait_count, early_again.stopped_epoch) == (early.wait_count, early.stopped_epoch) == (2, 0)
    assert best_again.best_k_models == best.best_k_models


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("callbacks", r"its callbacks\[.ModelCheckpoint.*\] holds a list, where a dict"),
        ("loops", r"its loops\['fit_loop'\] holds a list, where a dict"),
    ],
)
def test_a_finished_fits_state_that_is_not_one_is_refused_before_anything_is_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str, said: str
) -> None:
    """The checkpoint is read whole and checked first: a callback's state or the fit loop's that is
    not a mapping rejects the checkpoint (CorruptCheckpoint, naming the field), nothing touched."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mpjob_trainer.adapters.reload import lightning_finished
    from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint

    trainer, _, _ = _fit(tmp_path, monkeypatch, "bf16")
    last = _mpjobs(tmp_path)[12] / "lightning.ckpt"
    saved = torch.load(last, weights_only=False)
    (key,) = [name for name in saved["callbacks"] if name.startswith("ModelCheckpoint")]
    if damage == "callbacks":
        saved["callbacks"][key] = ["not", "a", "state"]
    else:
        saved["loops"]["fit_loop"] = ["not", "a", "state"]
    torch.save(saved, last)
    model, best = Fitted(), ModelCheckpoint(dirpath=str(tmp_path / "best"), monitor="val_loss", mode="max")
    before = {name: weight.clone() for name, weight in model.state_dict().items()}
    fresh = L.Trainer(max_steps=16, logger=False, enable_checkpointing=False)
    with pytest.raises(CorruptCheckpoint, match=f"lightning.ckpt: {said}"):
        lightning_finished(
            model, [best], last.parent, functools.partial(torch.load, weights_only=False), fresh.fit_loop
        )
    assert all(torch.equal(weight, before[name]) for name, weight in model.state_dict().items())
    assert (best.best_model_path, fresh.global_step) == ("", 0) and trainer.global_step == 12


def _fit_epochs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str) -> Any:
    """An attempt of the job in epochs of 8 steps, validated at each epoch's end, where mpjob
    checkpoints; the ModelCheckpoint saves at `on_train_epoch_end` and keeps the greatest val_loss
    (the first epoch's). Returns the ModelCheckpoint."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint={"everySteps": 8})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    best = ModelCheckpoint(
        dirpath=str(tmp_path / "best"), monitor="val_loss", mode="max", save_top_k=1, save_on_train_epoch_end=True
    )
    loader = torch.utils.data.DataLoader(_samples(32, 0), batch_size=4)
    settings = mpjob_lightning.trainer_settings(run, callbacks=[best], logger=False)
    try:
        trainer = L.Trainer(default_root_dir=str(tmp_path / "root"), **settings)
        val = torch.utils.data.DataLoader(_samples(16, 1), batch_size=8)
        mpjob_lightning.fit(run, trainer, Fitted(), train_dataloaders=loader, val_dataloaders=val)
    finally:
        run.close()
    return best


def test_a_model_checkpoint_saving_at_the_epochs_end_keeps_its_best_across_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ModelCheckpoint saves in `on_train_epoch_end`. Before, mpjob's checkpoint of the epoch's
    last step (8) was written ahead of it: the fallback attempt from step 8 knew no save of epoch 0
    and took epoch 1's for the best; now the checkpoint follows the epoch's end."""
    first = _fit_epochs(tmp_path, monkeypatch, "bf16")
    assert Path(first.best_model_path).name == "epoch=0-step=8.ckpt"
    for step, folder in _mpjobs(tmp_path).items():
        if step > 8:
            shutil.rmtree(folder.parent)
    again = _fit_epochs(tmp_path, monkeypatch, "fp32")
    assert (again.best_model_path, again.best_model_score) == (first.best_model_path, first.best_model_score)
    assert sorted(again.best_k_models) == sorted(first.best_k_models)
