"""The session's calls in their order (session.run's phase table): a call the phase does not
take is a configuration error that names the order, and never trains or checkpoints anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    job = spec(training={"steps": 6, "logEvery": 3}, checkpoint={"everySteps": 3})
    return in_process_launch(tmp_path, monkeypatch, job)


def _written(launch: AttemptLaunch) -> list[str]:
    """Everything in the checkpoint folder, also what a save in progress has written so far."""
    folder = Path(launch.checkpoint_dir)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def _report(launch: AttemptLaunch) -> str:
    return (Path(launch.checkpoint_dir).parent / "report.json").read_text()


def _train(run: mpjob.Session, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    run.backward(model(torch.randn(8, 4)).pow(2).mean())
    run.step(optimizer)
    run.end_step(step, samples=8)


def test_a_step_closed_after_the_session_closed_is_refused_and_never_checkpointed(launch: AttemptLaunch) -> None:
    """A loop that goes on after close(): its step at a checkpoint interval wrote a checkpoint
    after the report, which no longer named the attempt's newest checkpoint."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mpjob.start(launch=launch) as run:
        run.resume(model=model, optimizer=optimizer)
        for step in (1, 2):
            _train(run, model, optimizer, step)
        assert run.close() == 0
    report = _report(launch)
    assert TerminationReport.model_validate_json(report).step == 2
    with pytest.raises(ConfigError, match=r"end_step\(3\) after the session closed at step 2") as refused:
        _train(run, model, optimizer, 3)
    assert "close the session after the loop's last step" in str(refused.value)
    assert _written(launch) == [] and _report(launch) == report


def test_registering_a_step_after_the_session_closed_is_refused(launch: AttemptLaunch) -> None:
    with mpjob.start(launch=launch) as run:
        run.resume(model=nn.Linear(4, 1))
    with pytest.raises(ConfigError, match=r"register_step\(\) after the session closed at step 0"):
        run.register_step(lambda i: None)


def test_checkpoint_start_before_resume_is_a_config_error_naming_the_order(launch: AttemptLaunch) -> None:
    """checkpoint_start() writes step 0 of what resume() registered: called first, it wrote nothing,
    silently, and a rollback before the first interval's checkpoint had nothing to return to."""
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        run.checkpoint_start()
    assert ended.value.code == ExitCode.CONFIG_ERROR
    message = TerminationReport.model_validate_json(_report(launch)).message
    assert message.startswith("call run.resume(...) before checkpoint_start()"), message


def test_checkpoint_start_after_the_session_closed_is_refused(launch: AttemptLaunch) -> None:
    with mpjob.start(launch=launch) as run:
        run.resume(model=nn.Linear(4, 1))
    with pytest.raises(ConfigError, match=r"checkpoint_start\(\) after the session closed at step 0"):
        run.checkpoint_start()
    assert _written(launch) == []
