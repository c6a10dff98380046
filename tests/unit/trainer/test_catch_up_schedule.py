"""A catch-up (session.catch_up) runs the steps since the restored checkpoint again through the
registered step only: an LR scheduler the loop steps around that function stays where the
checkpoint left it, and the steps after would train on a shifted schedule. The catch-up says so,
naming the scheduler, instead of training on; one stepped inside the registered step comes back
to where the loop stood."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

#: A bad sample at step 8 (index 7), read at once: rolled back to the checkpoint of step 4, then
#: steps 5..8 run again through the registered step.
JOB = spec(training={"steps": 10, "batchSize": 4, "logEvery": 1}, checkpoint={"everySteps": 4})


def train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, inside: bool, named: bool = True
) -> tuple[TerminationReport, int]:
    """A linear model whose LambdaLR is stepped inside the registered step (`inside`) or by the loop
    around it; its loop names each step's samples (`named`), else its bad step is skipped whole;
    the attempt's report and the scheduler's last_epoch at the end."""
    with contextlib.suppress(SystemExit), mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, JOB)) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
        start = run.resume(model=model, optimizer=optimizer, scheduler=schedule)

        def one_step(i: int) -> None:
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            if i == 7 and i not in run.quarantined:
                x[0, 0] = math.nan
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            if inside:
                schedule.step()

        run.register_step(one_step, samples=(lambda i: [i]) if named else None)
        for i in range(start, run.total_steps):
            if named or not run.quarantined.skips_step(i):
                one_step(i)
            if not inside:
                schedule.step()
            run.end_step(i + 1, samples=4)
    return TerminationReport.model_validate_json((tmp_path / "report.json").read_text()), schedule.last_epoch


def test_a_scheduler_stepped_around_the_registered_step_ends_the_catch_up_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, last_epoch = train(tmp_path, monkeypatch, inside=False)
    assert report.reason == "ConfigError", report.message
    assert "scheduler" in report.message and "register_step" in report.message, report.message
    said = report.message
    assert "steps 5 to 8" in said and "last_epoch 4" in said and "at 8" in said, said
    assert last_epoch == 4  # where the checkpoint left it: nothing trained on past the catch-up
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 4


def test_a_scheduler_stepped_inside_the_registered_step_catches_up_with_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report, last_epoch = train(tmp_path, monkeypatch, inside=True)
    assert report.reason == "Succeeded" and report.skipped is not None, report.message
    assert last_epoch == 10


def test_a_step_skipped_whole_is_not_taken_for_a_scheduler_stepped_around_the_registered_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that names no samples has its bad step skipped whole: the catch-up runs no step
    there, and a scheduler stepped inside the registered step ends where a restarted attempt's
    loop (which skips the step too, docs/sdk.md) has it: one step fewer than the loop had it."""
    report, last_epoch = train(tmp_path, monkeypatch, inside=True, named=False)
    assert report.reason == "Succeeded" and report.skipped is not None, report.message
    assert last_epoch == 9  # steps 1..10 but the one skipped whole, as a restart trains them
