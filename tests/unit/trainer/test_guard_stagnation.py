"""guard.stagnationSteps: a loss or gradients stuck that many steps end the precision. The guard
sees the loss at its reads only, so a loss read twice the same was stuck from the first of the
two reads; a rollback in place counts the stuck steps from the rewound step again."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.api import Guard
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import NumericFault
from mpjob_trainer.guard import NumericGuard
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def guard(**spec: object) -> NumericGuard:
    return NumericGuard(Guard.model_validate(spec), CPU, World(rank=0, size=1, local_rank=0))


def read_at(g: NumericGuard, step: int, loss: float, grad_norm: float = 1.0) -> NumericFault | None:
    """The read at 1-based step `step` after a clean applied step, and what it finds."""
    g.begin_step()
    g.observe_loss(torch.tensor(loss))
    g.optimizer_stepped()
    g.end_step(step, uses_scaler=False)
    return g.check(step, g.read(None), loss, grad_norm)


def test_a_loss_read_the_same_twice_is_stuck_since_the_first_of_the_two_reads() -> None:
    g = guard(stagnationSteps=20)
    assert read_at(g, 10, 3.0) is None
    assert read_at(g, 20, 2.0) is None  # the loss stays 2.0 from here on
    assert read_at(g, 30, 2.0) is None  # stuck 10 steps
    fault = read_at(g, 40, 2.0)  # stuck 20 steps: guard.stagnationSteps
    assert fault is not None and fault.rule == "Stagnation"
    assert str(fault) == "loss or gradients stuck since step 20 (guard.stagnationSteps=20)"


def test_zero_gradients_are_stuck_since_the_first_read_that_sees_them() -> None:
    g = guard(stagnationSteps=20)
    assert read_at(g, 10, 3.0) is None
    assert read_at(g, 20, 2.0, 0.0) is None
    assert read_at(g, 30, 1.0, 0.0) is None
    fault = read_at(g, 40, 0.5, 0.0)
    assert fault is not None and str(fault) == "loss or gradients stuck since step 20 (guard.stagnationSteps=20)"


def test_a_rollback_in_place_counts_the_stuck_steps_from_the_rewound_step_again() -> None:
    """Gradients stuck from step 30, rolled back to step 10 (an in-place recovery): the steps
    run again are stuck from the re-run read at step 20, as a restarted attempt would count them,
    not from step 30 of the rolled-back run."""
    g = guard(stagnationSteps=30)
    assert read_at(g, 10, 4.0) is None
    assert read_at(g, 20, 3.0) is None
    assert read_at(g, 30, 2.0, 0.0) is None
    assert read_at(g, 40, 2.5, 0.0) is None
    g.rewind(10)
    assert read_at(g, 20, 3.5, 0.0) is None
    assert read_at(g, 30, 1.5, 0.0) is None
    assert read_at(g, 40, 1.0, 0.0) is None
    fault = read_at(g, 50, 0.5, 0.0)
    assert fault is not None and str(fault) == "loss or gradients stuck since step 20 (guard.stagnationSteps=30)"


def test_a_gradient_norm_a_loop_said_once_is_not_read_at_the_steps_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that steps its optimizer itself says the norm when it has one (end_step(grad_norm=)):
    a 0 said at step 1 is not the norm of the steps after it, whose losses fall: nothing is stuck."""
    job = spec(
        task={"command": ["python", "own.py"]},
        training={"steps": 30, "logEvery": 5},
        precision={"mode": "fp32", "guard": {"stagnationSteps": 10}},
    )
    with mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job)) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        run.resume(model=model, optimizer=optimizer)
        x = torch.randn(16, 4)
        for step in range(1, run.total_steps + 1):
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            run.end_step(step, grad_norm=0.0 if step == 1 else None)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == Reason.SUCCEEDED and report.step == 30, report
