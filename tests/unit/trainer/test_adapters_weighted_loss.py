"""Under a framework adapter the job's loss weighs each rank by the samples it trained on
(job_loss): the framework runs backward itself, so the adapter tells each rank's samples at the
step's end; ranks of unequal batches (unequal shards, an epoch's short last batch) no longer
weigh alike. Two gloo processes of the launcher, real transformers and real Lightning."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.helpers import launched
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
SCRIPT = str(Path(__file__).with_name("weighted_ranks_script.py"))


@pytest.mark.process
@pytest.mark.parametrize("framework", ["hf", "hf-items", "lightning"])
def test_ranks_of_unequal_batches_weigh_by_their_samples(tmp_path: Path, framework: str) -> None:
    """Rank 0: 6 samples of loss 1 a step; rank 1: 2 of loss 9 (weighted_ranks_script.py): the
    job's loss is 3, not the ranks' plain mean 5. A Hugging Face loss the Trainer normalised over
    every rank's items (`hf-items`) is its rank's share already: the ranks weigh alike, and the
    job's loss is 3 again, not 2.25."""
    command = [sys.executable, SCRIPT, framework]
    job = spec(task={"command": command}, training={"steps": 2, "logEvery": 1}, checkpoint={"everySteps": 100})
    paths = [str(REPO), *(f"{REPO}/{package}" for package in ("trainer-image", "contract", "operator"))]
    env = launch_env(tmp_path, job, "fp32", extra={"PYTHONPATH": os.pathsep.join(paths)})
    losses = {e["step"]: e["loss"] for e in parse(launched(env, 2, command)) if e["event"] == "step"}
    assert losses == {1: pytest.approx(3.0), 2: pytest.approx(3.0)}, losses


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_loss_samples_that_are_no_count_are_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: object
) -> None:
    import torch

    from mpjob_trainer import session as mpjob
    from tests.unit.trainer.conftest import in_process_launch

    model = torch.nn.Linear(1, 1)
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, spec(training={"steps": 2}), "fp32"))
    try:
        run.resume(model=model)
        with pytest.raises(mpjob.ConfigError, match=r"loss_samples is how many samples the loss covers"):
            run.end_step(1, loss=1.0, loss_samples=bad)  # type: ignore[arg-type]
    finally:
        run.close()
