"""An fp32 replay runs a step skipped whole (its loop names no samples) as the catch-up and the
loop do: not at all. Replayed, it trained on the data it was skipped for, so a second bad step
soon after the first ended the attempt for data the loop does leave out (or, under a framework
adapter, whose skipped step recorded no batch to replay, blamed the precision)."""

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


def test_a_replay_leaves_out_a_step_skipped_whole_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Steps 5 and 6 (indexes 4 and 5) are bad, each a fault at its end; the checkpoint at step 4 is
    # the last good one for both, so the second's replay window (up to 4 steps) holds the first.
    job = spec(
        training={"steps": 10, "batchSize": 4, "logEvery": 10},
        precision={"mode": "fp16", "lossScale": {"init": 128.0}, "guard": {"maxConsecutiveOverflows": 1}},
        checkpoint={"everySteps": 4},
    )
    with (
        contextlib.suppress(SystemExit),
        mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp16")) as run,
    ):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:  # trains step i's data, whatever it is: the loop leaves skipped steps out
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            x[0, 0] = math.nan if i in (4, 5) else x[0, 0]
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        run.register_step(one_step)  # no samples named: a bad step is skipped whole
        for i in range(start, run.total_steps):
            if not run.quarantined.skips_step(i):
                one_step(i)
            run.end_step(i + 1, samples=4)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "Succeeded", report.message
    assert report.skipped is not None and [s.step for s in report.skipped.steps] == [4, 5]
