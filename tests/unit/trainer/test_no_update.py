"""A training that applies no update never ends "Succeeded", and no checkpoint claims its steps:
a loop that never steps (it never calls run.step(), or a GradScaler of its own skips every step)
is a ConfigError at the first checkpoint interval none of whose steps stepped; a run whose every
step GradScaler skipped ends in the overflow rule, before guard.maxConsecutiveOverflows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.session.updates import UpdateWatch
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

#: One step of a loop: (run, its step index, loss, optimizer, its own scaler).
Step = Callable[[mpjob.Session, int, torch.Tensor, torch.optim.Optimizer, torch.amp.GradScaler], None]


def _own_scaler_swallows(
    run: mpjob.Session, _: int, loss: torch.Tensor, opt: torch.optim.Optimizer, own: torch.amp.GradScaler
) -> None:
    run.backward(own.scale(loss))  # scaled by its own scale, then by the attempt's: inf in fp16
    own.step(opt)  # finds the inf and never calls opt.step()
    own.update()


def _never_steps(
    run: mpjob.Session, _: int, loss: torch.Tensor, opt: torch.optim.Optimizer, __: torch.amp.GradScaler
) -> None:
    run.backward(loss)


def _steps_every_other(
    run: mpjob.Session, index: int, loss: torch.Tensor, opt: torch.optim.Optimizer, _: torch.amp.GradScaler
) -> None:
    run.backward(loss)
    if index % 2:
        run.step(opt)


def _train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, step: Step, *, scale: float = 1.0
) -> tuple[int, TerminationReport, int]:
    """The attempt's exit code, its report, and the updates the optimizer applied."""
    job = spec(training={"steps": 4, "logEvery": 1}, checkpoint={"everySteps": 2}, precision={"mode": precision})
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    applied, code = [0], 0
    try:
        with mpjob.start(launch=launch) as run:
            model = nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            optimizer.register_step_post_hook(lambda *_: applied.__setitem__(0, applied[0] + 1))
            run.resume(model=model, optimizer=optimizer)
            own = torch.amp.GradScaler("cpu", init_scale=2.0**16)
            for index in range(run.total_steps):
                with run.autocast():
                    loss = model(torch.ones(2, 4)).float().pow(2).mean() * scale
                step(run, index, loss, optimizer, own)
                optimizer.zero_grad()
                run.end_step(index + 1, samples=2)
    except SystemExit as ended:
        code = int(ended.code or 0)
    return code, TerminationReport.model_validate_json((tmp_path / "report.json").read_text()), applied[0]


@pytest.mark.parametrize(
    ("precision", "step"), [("fp16", _own_scaler_swallows), ("fp16", _never_steps), ("fp32", _never_steps)]
)
def test_a_loop_that_never_steps_is_a_config_error_before_its_first_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, step: Step
) -> None:
    code, report, applied = _train(tmp_path, monkeypatch, precision, step)
    assert applied == 0
    assert code == ExitCode.CONFIG_ERROR and report.reason == "ConfigError", report.message
    assert "steps 1 to 2 each ran run.backward() and no optimizer stepped" in report.message
    assert "Remove your own torch.amp.GradScaler" in report.message
    assert report.last_good_checkpoint is None  # step 2's checkpoint would have claimed them
    assert not list((tmp_path / "ckpt").glob("step-*"))


def test_a_loop_that_steps_now_and_then_trains_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, report, applied = _train(tmp_path, monkeypatch, "fp32", _steps_every_other)
    assert code == ExitCode.SUCCESS and report.reason == "Succeeded", report.message
    assert applied == 2


def test_a_run_whose_every_step_overflowed_ends_in_the_overflow_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four steps, each one's gradients inf at the backed-off scale (65536 down to 8192), under
    guard.maxConsecutiveOverflows=20: before, the run ended Succeeded with no update applied."""
    code, report, applied = _train(tmp_path, monkeypatch, "fp16", _stepped, scale=1e4)
    assert applied == 0
    assert code == ExitCode.NUMERIC_FAULT and report.reason == "NumericFault", report.message
    assert report.message.startswith("MaxConsecutiveOverflows")
    assert "4 consecutive overflow-skipped steps, every step the attempt trained" in report.message


def _stepped(
    run: mpjob.Session, _: int, loss: torch.Tensor, opt: torch.optim.Optimizer, __: torch.amp.GradScaler
) -> None:
    run.backward(loss)
    run.step(opt)


def test_the_watch_waits_for_a_whole_interval_of_steps_that_applied_nothing() -> None:
    watch = UpdateWatch()
    watch.close(backward=True, asked=True, applied=True, judged=True)
    for _ in range(3):
        watch.close(backward=True, asked=False, applied=False, judged=True)
    assert watch.idle_fault(4, 5, last=False) is None  # an interval of five: two more to go
    assert isinstance(watch.idle_fault(4, 3, last=False), ConfigError)
    watch.close(backward=True, asked=True, applied=True, judged=True)
    assert watch.idle_fault(5, 1, last=True) is None  # an update applied: the run starts over
    resumed = UpdateWatch()  # a process that starts mid-interval: every step it closed counts
    resumed.close(backward=True, asked=False, applied=False, judged=True)
    assert isinstance(resumed.idle_fault(10, 5, last=True), ConfigError)


def test_the_watch_tells_skipped_updates_only_when_the_whole_run_skipped() -> None:
    watch = UpdateWatch()
    watch.close(backward=True, asked=True, applied=True, judged=True)
    watch.close(backward=True, asked=True, applied=False, judged=True)
    assert watch.idle_fault(2, 1, last=True) is None  # one overflow-skipped last step: routine
    fresh = UpdateWatch()
    for _ in range(2):
        fresh.close(backward=True, asked=True, applied=False, judged=True)
    assert fresh.idle_fault(2, 2, last=False) is None  # mid-run: the guard's rule, and no checkpoint
    assert isinstance(fresh.idle_fault(2, 2, last=True), NumericFault)


def test_steps_without_backward_or_the_loops_own_are_not_judged() -> None:
    watch = UpdateWatch()
    watch.close(backward=False, asked=False, applied=False, judged=True)  # an evaluation step
    watch.close(backward=True, asked=False, applied=False, judged=False)  # quarantined, or a framework's
    assert watch.idle_fault(2, 2, last=True) is None


def _promoted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, in_place: bool) -> tuple[int, TerminationReport]:
    """An fp32 attempt re-promoted into fp16 after step 4 (in place, or the restart path's fp16
    attempt resumed from its checkpoint), every fp16 step's gradients inf: its code and report."""
    job = spec(
        training={"steps": 8, "logEvery": 1},
        checkpoint={"everySteps": 4},
        precision={"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 4},
    )
    fp32 = in_process_launch(tmp_path, monkeypatch, job, "fp32").model_copy(update={"repromote_after_steps": 4})
    launches = (
        [fp32.model_copy(update={"promote_in_place_to": InPlaceTarget(precision="fp16")})]
        if in_place
        else [fp32, fp32.model_copy(update={"attempt": 1, "precision": "fp16", "repromote_after_steps": None})]
    )
    code = 0
    for launch in launches:
        try:
            with mpjob.start(launch=launch) as run:
                torch.manual_seed(0)
                model = nn.Linear(4, 1)
                optimizer = torch.optim.SGD(model.parameters(), lr=1e-12)
                start = run.resume(model=model, optimizer=optimizer)
                for index in range(start, run.total_steps):
                    with run.autocast():
                        loss = model(torch.ones(2, 4)).float().pow(2).mean() * 1e4
                    _stepped(run, index, loss, optimizer, None)  # type: ignore[arg-type]
                    run.end_step(index + 1, samples=2)
            code = 0
        except SystemExit as ended:
            code = int(ended.code or 0)
    return code, TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


def test_an_attempt_promoted_in_place_whose_every_step_overflowed_ends_as_the_restarted_one_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Steps 5 to 8 in fp16 all skipped: the re-promoted attempt applied no update, in place as
    after a restart (the fp32 steps before it were another attempt's): before, the attempt begun in
    place counted the launched one's steps as its own and ended Succeeded on weights it never trained."""
    restart_code, restarted = _promoted(tmp_path / "restart", monkeypatch, in_place=False)
    assert restart_code == ExitCode.NUMERIC_FAULT, restarted.message
    code, report = _promoted(tmp_path / "inplace", monkeypatch, in_place=True)
    assert [c.kind for c in report.precision_changes] == ["repromote"]
    assert code == ExitCode.NUMERIC_FAULT and report.reason == "NumericFault", report.message
    assert "4 consecutive overflow-skipped steps, every step the attempt trained" in report.message
    assert report.message == restarted.message
