"""Another job's checkpoint in this job's folder (checkpoint.ownership): never replaced. At the
last step the attempt cannot end on a checkpoint of its own, and every retry would train back
to that step: a configuration error naming the folder and what to do. A SIGTERM save that
finds its step taken is a failed save as before, retried: a later attempt stops elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.checkpoint import CheckpointStore
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

OTHER_JOB = "ns/other/u2"


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    job = spec(training={"steps": 6, "logEvery": 3}, checkpoint={"everySteps": 3})
    return in_process_launch(tmp_path, monkeypatch, job)


def foreign_checkpoint(launch: AttemptLaunch, step: int) -> Path:
    """Another job's checkpoint of `step` in this job's checkpoint folder."""
    store = CheckpointStore(Path(launch.checkpoint_dir), keep=5, config_digest="other", job=OTHER_JOB)
    return Path(store.write(step, "fp32", {"model": {"w": torch.zeros(1)}}).ref.path)


def train(launch: AttemptLaunch, *, preempt_at: int | None = None) -> tuple[int, TerminationReport]:
    """An own loop to training.steps (SIGTERM before step `preempt_at` closes): its exit code and report."""
    code = ExitCode.SUCCESS
    try:
        with mpjob.start(launch=launch) as run:
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(run.resume(model=model, optimizer=optimizer), run.total_steps):
                run.backward(model(torch.randn(8, 4)).pow(2).mean())
                run.step(optimizer)
                run.preemption.raised = step + 1 == preempt_at
                run.end_step(step + 1, samples=8)
    except SystemExit as ended:
        code = ended.code  # type: ignore[assignment]
    report = (Path(launch.checkpoint_dir).parent / "report.json").read_text()
    return code, TerminationReport.model_validate_json(report)


def test_another_jobs_checkpoint_at_the_last_step_is_a_config_error_naming_it(launch: AttemptLaunch) -> None:
    taken = foreign_checkpoint(launch, 6)
    code, report = train(launch)
    assert code == ExitCode.CONFIG_ERROR, report.message
    assert report.reason == "ConfigError"
    assert f"{taken}, in this job's checkpoint folder" in report.message
    assert "a checkpoint another job wrote" in report.message and "every attempt" in report.message
    assert "Move it out of the folder" in report.message
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 3
    assert (taken / "manifest.json").exists()  # left as it is


def test_a_preemption_save_at_another_jobs_checkpoint_is_retried_not_a_config_error(launch: AttemptLaunch) -> None:
    taken = foreign_checkpoint(launch, 3)
    code, report = train(launch, preempt_at=3)
    assert code == ExitCode.INFRA_ERROR and report.reason != "ConfigError", report.message
    assert report.last_good_checkpoint is None and (taken / "manifest.json").exists()
