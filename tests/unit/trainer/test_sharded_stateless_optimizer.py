"""A sharded model's optimizer with no state (SGD without momentum) in fp16: torch's
get_state_dict, which captures a sharded checkpoint, steps an optimizer that holds no state on
zero gradients to make its state. In fp16 that step tripped the check on steps made outside
run.step(), and the attempt ended ConfigError at its first checkpoint, blaming the script."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec, train_squares

pytestmark = pytest.mark.unit

JOB = spec(training={"steps": 8, "batchSize": 4, "logEvery": 2}, checkpoint={"everySteps": 4, "keep": 5})


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_sharded_stateless_optimizer_checkpoints_in_any_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], precision: str
) -> None:
    job = {**JOB, "precision": {"mode": precision}, "parallelism": {"strategy": "fsdp"}}
    launch = in_process_launch(tmp_path, monkeypatch, job, precision)
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = run.wrap(nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # no momentum: no state
        start = run.resume(model=model, optimizer=optimizer)
        train_squares(
            run, model, optimizer, start, lambda i: torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        )
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "Succeeded", report.message
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 8
    steps = [e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e.get("event") == "step"]
    applied = [(e["step"], e["appliedSteps"] + e["overflowSteps"]) for e in steps]
    assert applied == [(2, 2), (4, 4), (6, 6), (8, 8)], "a state-dict function's step counted as an update"
