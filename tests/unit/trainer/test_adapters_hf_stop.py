"""A stop a Hugging Face Trainer callback tells inside an optimizer step's gradient accumulation
(`control.should_training_stop` at `on_substep_end`, a micro-batch that steps no optimizer): the
Trainer would leave its loop there, after the step it last closed, that step closed as an
ordinary one. The stop waits for the step's end instead, so the run ends on a whole step that
mpjob checkpoints with the stop recorded, as a stop at a step's end does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_arguments import Regression
from tests.unit.trainer.test_adapters_own_checkpoints import _mpjobs, _samples

pytestmark = pytest.mark.unit

#: Two micro-batches of 4 a step, 16 steps; mpjob checkpoints every 4.
JOB = {"steps": 16, "batchSize": 4, "gradAccumulation": 2, "logEvery": 2, "seed": 0, "learningRate": 1e-2}


class StopInside(TrainerCallback):
    """Tells the Trainer to stop at the end of its `substep`-th micro-batch that steps no optimizer."""

    def __init__(self, substep: int) -> None:
        self.substep, self.seen = substep, 0

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seen += 1
        if self.seen == self.substep:
            control.should_training_stop = True


def test_a_stop_inside_a_steps_accumulation_waits_for_the_step_and_is_checkpointed_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 11th such micro-batch is the first of step 11. Before, the Trainer left after step 10,
    closed as an ordinary step: mpjob's last checkpoint was step 8's and the report said no stop."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]}, training=JOB, checkpoint={"everySteps": 4})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        args = mpjob_hf.training_arguments(run, output_dir=str(tmp_path / "out"))
        trainer = Trainer(model=Regression(), args=args, train_dataset=_samples(128, 0), callbacks=[StopInside(11)])
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    assert trainer.state.global_step == 11 and max(_mpjobs(tmp_path)) == 11
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["reason"], report["step"]) == ("Succeeded", 11) and "stopped early" in report["message"]
    saved = torch.load(_mpjobs(tmp_path)[11].parent / "state.pt", weights_only=False)
    assert saved["stoppedEarly"] == {"step": 11}
