"""A loop's own torch.amp.GradScaler (or its own optimizer.step()) in an fp16 attempt: told at the
first step it applies, never silently kept. It would step on gradients the attempt's GradScaler
scaled (or scale them twice), and the guard's loss-scale figures would be another scaler's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

#: One step of a loop brought with its own scaling: (run, loss, optimizer, its own scaler).
OwnStep = Callable[[mpjob.Session, torch.Tensor, torch.optim.Optimizer, torch.amp.GradScaler], None]


def _own_scaler_whole(
    run: mpjob.Session, loss: torch.Tensor, opt: torch.optim.Optimizer, own: torch.amp.GradScaler
) -> None:
    own.scale(loss).backward()
    own.step(opt)
    own.update()


def _own_scaler_steps(
    run: mpjob.Session, loss: torch.Tensor, opt: torch.optim.Optimizer, own: torch.amp.GradScaler
) -> None:
    run.backward(own.scale(loss))  # scaled twice: by its own scale, then by the attempt's
    own.step(opt)
    own.update()


def _own_optimizer_step(
    run: mpjob.Session, loss: torch.Tensor, opt: torch.optim.Optimizer, _: torch.amp.GradScaler
) -> None:
    run.backward(loss)
    opt.step()  # on gradients still scaled by the attempt's GradScaler


def _train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, own_step: OwnStep
) -> tuple[int, TerminationReport]:
    """The attempt's exit code and report."""
    job = spec(training={"steps": 2, "logEvery": 1}, checkpoint={"everySteps": 2}, precision={"mode": precision})
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    code = 0
    try:
        _loop(launch, own_step)
    except SystemExit as ended:
        code = int(ended.code or 0)
    return code, TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


def _loop(launch: AttemptLaunch, own_step: OwnStep) -> None:
    with mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(model=model, optimizer=optimizer)
        own = torch.amp.GradScaler("cpu", init_scale=2.0)  # low: twice scaled, fp16 still holds it
        for step in range(run.total_steps):
            with run.autocast():
                loss = model(torch.ones(2, 4)).float().pow(2).mean() * 1e-3  # small: scaled twice, still finite
            own_step(run, loss, optimizer, own)
            optimizer.zero_grad()
            run.end_step(step + 1, samples=2)


@pytest.mark.parametrize("own_step", [_own_scaler_whole, _own_scaler_steps, _own_optimizer_step])
def test_an_fp16_attempt_refuses_an_optimizer_stepped_outside_run_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_step: OwnStep
) -> None:
    code, report = _train(tmp_path, monkeypatch, "fp16", own_step)
    assert code == ExitCode.CONFIG_ERROR, report.message
    assert "SGD was stepped outside run.step()" in report.message
    assert "Remove your own torch.amp.GradScaler" in report.message
    assert report.step == 0  # refused at its first update


def test_a_bf16_attempt_leaves_a_loops_own_optimizer_step_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No loss scale in bf16: the gradients are the loss's own, and the loop may step itself."""
    code, report = _train(tmp_path, monkeypatch, "bf16", _own_optimizer_step)
    assert code == ExitCode.SUCCESS and report.reason == "Succeeded", report.message


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_loops_own_clipping_after_unscale_clips_the_true_gradients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Clipping of the loop's own before run.step() (clip_grad_value_, per group, ...): in fp16 it
    clipped gradients still scaled by the loss scale, 65536 times too far. run.unscale(optimizer)
    first unscales them (nothing outside fp16), and step() does not unscale them again."""
    job = spec(training={"steps": 2, "logEvery": 1}, checkpoint={"everySteps": 2}, precision={"mode": precision})
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    with mpjob.start(launch=launch) as run:
        model = nn.Linear(1, 1, bias=False)
        nn.init.ones_(model.weight)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        run.resume(model=model, optimizer=optimizer)
        for step in range(run.total_steps):
            run.backward(model(torch.full((1, 1), 4.0)).float().sum())  # the gradient is 4
            run.unscale(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            run.step(optimizer)
            run.end_step(step + 1, samples=1)
            assert model.weight.item() == pytest.approx(1.0 - 0.1 * (step + 1), abs=1e-3)  # clipped to 1
