"""Lightning ending a fit short of spec.training.steps on its own decision: the run ends on a whole
step that mpjob checkpoints with the stop recorded. A stop told inside an optimizer step's
gradient accumulation (a Timer's max_time or a callback's `should_stop` at a micro-batch that
steps no optimizer) waits for the step's end: Lightning would leave fit there, after the step it
last closed, that step closed as an ordinary one. An epoch limit (`max_epochs`) reached first is a
stop as well."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_own_checkpoints import Fitted, _mpjobs, _samples

pytestmark = pytest.mark.unit

#: Two micro-batches of 4 a step, 16 steps; mpjob checkpoints every 4.
JOB = {"steps": 16, "batchSize": 4, "gradAccumulation": 2, "logEvery": 2, "seed": 0, "learningRate": 1e-2}


class StopAt(L.Callback):
    """Sets `should_stop` at the end of micro-batch `batch` (0-based), as a Timer does at its limit."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_end(self, trainer: L.Trainer, module: Any, outputs: Any, batch: Any, index: int) -> None:
        if index == self.batch:
            trainer.should_stop = True


def _fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stop_at: int = -1, samples: int = 128, **given: Any
) -> L.Trainer:
    """An attempt of the job under `fit` (128 samples: one epoch), told to stop at micro-batch
    `stop_at`, the Trainer's other arguments `given`."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, checkpoint={"everySteps": 4})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    loader = torch.utils.data.DataLoader(_samples(samples, 0), batch_size=4)
    settings = mpjob_lightning.trainer_settings(run, callbacks=[StopAt(stop_at)], logger=False, **given)
    try:
        trainer = L.Trainer(default_root_dir=str(tmp_path / "root"), limit_val_batches=0, **settings)
        mpjob_lightning.fit(run, trainer, Fitted(), train_dataloaders=loader)
    finally:
        run.close()
    return trainer


def _report(tmp_path: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    return report


def test_a_stop_inside_a_steps_accumulation_waits_for_the_step_and_is_checkpointed_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Micro-batch 20 is the first of step 11. Before, Lightning stopped after step 10, closed as
    an ordinary step: the report said no stop, and mpjob's last checkpoint was step 8's (steps 9
    and 10 were not kept; a retry trained on past the stop to step 16)."""
    trainer = _fit(tmp_path, monkeypatch, stop_at=20)
    assert trainer.global_step == 11
    assert max(_mpjobs(tmp_path)) == 11
    report = _report(tmp_path)
    assert (report["reason"], report["step"]) == ("Succeeded", 11) and "stopped early" in report["message"]
    saved = torch.load(_mpjobs(tmp_path)[11].parent / "state.pt", weights_only=False)
    assert saved["stoppedEarly"] == {"step": 11}


def test_a_stop_at_a_steps_own_micro_batch_stops_after_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Micro-batch 21 ends step 11: the stop needs no wait."""
    trainer = _fit(tmp_path, monkeypatch, stop_at=21)
    assert trainer.global_step == 11 and max(_mpjobs(tmp_path)) == 11
    assert "stopped early" in _report(tmp_path)["message"]


def test_an_epoch_limit_reached_before_the_steps_ends_the_run_on_its_last_step_checkpointed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max_epochs=1` over 12 micro-batches: Lightning leaves fit after step 6 of 16. Before, step 6
    closed as an ordinary step: mpjob's last checkpoint was step 4's and the report said no stop."""
    trainer = _fit(tmp_path, monkeypatch, samples=48, max_epochs=1)
    assert trainer.global_step == 6 and max(_mpjobs(tmp_path)) == 6
    assert "stopped early" in _report(tmp_path)["message"]
