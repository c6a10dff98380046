"""A SIGTERM that reaches a re-promotion's checkpoint step (the pod is being stopped: a
suspension, a preemption, a resize) stops the attempt there, as at any other checkpoint step: a
re-promotion in place would train on past it, toward a kill at the end of the pod's grace."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 16, "batchSize": 4, "logEvery": 8},
    precision={"mode": "bf16", "fallback": ["fp32"], "repromoteAfterSteps": 4},
    checkpoint={"everySteps": 4},
)


def test_a_sigterm_at_a_repromotions_checkpoint_stops_there_not_after_going_up_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32 = in_process_launch(tmp_path, monkeypatch, JOB, "fp32")
    launch = fp32.model_copy(
        update={"repromote_after_steps": 4, "promote_in_place_to": InPlaceTarget(precision="bf16")}
    )
    trained: list[int] = []
    with pytest.raises(SystemExit) as ended, mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(run.resume(model=model, optimizer=optimizer), run.total_steps):
            trained.append(i)
            with run.autocast():
                loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            run.preemption.raised = run.preemption.raised or i == 3  # SIGTERM during step 4, re-promotion's
            run.end_step(i + 1, samples=4)
    assert ended.value.code == ExitCode.PREEMPTED
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report.reason == "Preempted" and report.step == 4, report.message
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 4
    assert trained == [0, 1, 2, 3]
