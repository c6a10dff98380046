"""An fp32 replay whose load of the last good checkpoint fails partway (here: an object loaded
before the failing one) leaves the objects half loaded. The run never trains on them: it goes on
from the checkpoint loaded whole again, or the attempt ends naming the checkpoint it cannot load."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, parse, spec, train_squares

pytestmark = pytest.mark.unit

BAD = 12  # step index with a non-finite sample; checkpoints every 5 steps


class Flaky:
    """A stateful object registered after the model: its load fails `fails` times once armed."""

    def __init__(self) -> None:
        self.fails = 0

    def state_dict(self) -> dict[str, Any]:
        return {"x": 1}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.fails:
            self.fails -= 1
            raise RuntimeError("the store went away midway")


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fails: int) -> tuple[dict[int, list[Any]], Any]:
    """fp16 steps of a linear model; step BAD's loss is non-finite (suspect: replayed); from then
    on Flaky's load fails `fails` times. The weights each step index began from, every time it ran."""
    job = spec(
        training={"steps": 20, "batchSize": 4, "logEvery": 5},
        precision={"mode": "fp16", "guard": {"maxNonFiniteLosses": 3}},
        checkpoint={"everySteps": 5, "keep": 5},
    )
    flaky, began = Flaky(), {}
    ends = pytest.raises(SystemExit) if fails > 1 else contextlib.nullcontext()
    with ends, mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp16")) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        start = run.resume(model=model, optimizer=optimizer, flaky=flaky)

        def inputs(i: int) -> torch.Tensor:
            began.setdefault(i, []).append(model.weight.detach().clone())
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            if i == BAD:
                x[0, 0], flaky.fails = math.nan, fails
            return x

        train_squares(run, model, optimizer, start, inputs)
    return began, TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


def test_a_replay_whose_load_failed_partway_goes_on_from_the_checkpoint_loaded_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    began, report = _train(tmp_path, monkeypatch, fails=1)
    skipped = [e for e in parse(capsys.readouterr().out) if e["event"] == "replaySkipped"]
    assert skipped and "the store went away midway" in skipped[0]["why"]
    assert report.reason == "Succeeded", report.message
    again = [i for i, times in began.items() if len(times) > 1]
    assert again and min(again) == 10  # the steps after the checkpoint at step 10 ran again
    first, rerun = began[10]
    assert torch.equal(first, rerun)  # from the checkpoint's weights, not those the failed load left


def test_a_checkpoint_that_keeps_failing_to_load_ends_the_attempt_without_training_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    began, report = _train(tmp_path, monkeypatch, fails=99)  # every load, the put-backs of a failed one too
    assert report.reason != "Succeeded" and "the store went away midway" in report.message, report.message
    assert all(len(times) == 1 for times in began.values())  # no step ran after the failed loads
