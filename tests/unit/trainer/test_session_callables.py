"""What the loop hands the session to call back (`register_step`'s step, samples and reshape,
`evaluate_with`'s evaluation) is callable, else a configuration error at the call that names it:
not a TypeError the first time the session calls it, which ends the attempt an InfraError that
the operator retries as the platform's fault."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec, train_squares

pytestmark = pytest.mark.unit


def _report(tmp_path: Path) -> TerminationReport:
    return TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


def test_an_evaluation_that_is_not_callable_is_a_config_error_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With spec.validation set, `evaluate_with(5)` ended the attempt an InfraError at the first
    validation step ("'int' object is not callable"), retried in the same precision."""
    job = spec(training={"steps": 4, "logEvery": 2}, validation={"everySteps": 2, "maxLossDelta": 0.05})
    launch = in_process_launch(tmp_path, monkeypatch, job)
    trained: list[int] = []
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)
        run.evaluate_with(5)  # type: ignore[arg-type]
        train_squares(run, model, optimizer, start, lambda i: trained.append(i) or torch.ones(4, 4))
    assert ended.value.code == ExitCode.CONFIG_ERROR, _report(tmp_path).message
    report = _report(tmp_path)
    assert report.reason == "ConfigError" and trained == []
    assert report.message.startswith("evaluate_with(evaluate=5): evaluate is a function"), report.message


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"step": 5}, "register_step(step=5): step is a function"),
        ({"samples": [0, 1]}, "register_step(samples=[0, 1]): samples is a function"),
        ({"reshape": 4}, "register_step(reshape=4): reshape is a function"),
    ],
)
def test_a_registered_step_argument_that_is_not_callable_is_a_config_error_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arguments: dict[str, Any], says: str
) -> None:
    launch = in_process_launch(tmp_path, monkeypatch, spec(training={"steps": 2, "logEvery": 1}))
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        run.resume(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
        run.register_step(**{"step": lambda i: None, **arguments})
        run.run_step(0)
        run.end_step(1)
    assert ended.value.code == ExitCode.CONFIG_ERROR, _report(tmp_path).message
    assert _report(tmp_path).message.startswith(says), _report(tmp_path).message
