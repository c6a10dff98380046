"""The fp32 replay runs each replayed step as training ran it: a loop whose learning rate follows
`run.applied_steps` (the builtin's warm-up and cosine, docs/sdk.md's example) gets the rate it had
at that step, counted from the checkpoint the replay starts at, one more for each update applied."""

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

#: fp16 whose step 7 (index 6) has a non-finite loss in fp16 only: the guard ends the precision at
#: the read of step 7 and the replay runs indexes 4..6 in fp32 from the checkpoint of step 4.
JOB = spec(
    training={"steps": 10, "batchSize": 4, "logEvery": 1},
    checkpoint={"everySteps": 4},
    precision={"mode": "fp16", "guard": {"onBadData": "fail", "maxNonFiniteLosses": 1}},
)


def test_a_replayed_step_trains_at_the_learning_rate_training_had_at_that_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rates: dict[str, dict[int, float]] = {"fp16": {}, "fp32": {}}
    launch = in_process_launch(tmp_path, monkeypatch, JOB, "fp16")
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            for group in optimizer.param_groups:
                group["lr"] = 0.01 * (run.applied_steps + 1)  # a warm-up driven by applied steps
            rates[run.precision][i] = optimizer.param_groups[0]["lr"]
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss * math.inf if i == 6 and run.precision == "fp16" else loss)
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i])
        for i in range(start, run.total_steps):
            one_step(i)
            run.end_step(i + 1, samples=4)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "NumericFault" and report.replay is not None, report.message
    assert report.replay.verdict == "precision" and report.replay.steps == 3
    replayed = rates["fp32"]
    assert sorted(replayed) == [4, 5, 6]
    # training's rates at those steps (GradScaler skipped its first step: 0.01 twice, then one more each)
    assert [rates["fp16"][i] for i in (4, 5, 6)] == pytest.approx([0.04, 0.05, 0.06])
    assert [replayed[i] for i in (4, 5, 6)] == pytest.approx([rates["fp16"][i] for i in (4, 5, 6)])
