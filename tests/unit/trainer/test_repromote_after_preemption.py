"""A fallback attempt preempted (or evicted, or its node lost) and resumed in the same precision
keeps counting its clean steps from its last numeric trouble, carried in its checkpoint: a job
preempted more often than every repromoteAfterSteps steps still goes back up. A resume in another
precision than the checkpoint's (a fallback into it) counts from its start."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.session.clean_steps import LastTrouble
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 24, "batchSize": 4, "logEvery": 2},
    precision={"mode": "bf16", "fallback": ["fp32"], "repromoteAfterSteps": 8},
    checkpoint={"everySteps": 4},
)


def attempt(launch: AttemptLaunch, tmp_path: Path, *, stop_at: int | None) -> TerminationReport:
    """One attempt of a linear model's loop in this process: SIGTERM during step `stop_at`, if given."""
    with pytest.raises(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(run.resume(model=model, optimizer=optimizer), run.total_steps):
            with run.autocast():
                loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            run.preemption.raised = run.preemption.raised or i + 1 == stop_at
            run.end_step(i + 1, samples=4)
    return TerminationReport.parse_message((tmp_path / "report.json").read_text())


def test_a_preempted_fallback_attempt_resumed_in_its_precision_goes_back_up_after_its_clean_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32 = in_process_launch(tmp_path, monkeypatch, JOB, "fp32").model_copy(update={"repromote_after_steps": 8})
    first = attempt(fp32, tmp_path, stop_at=6)
    assert first.reason == "Preempted" and first.step == 6, first.message
    # the restart the preemption costs nothing of: the same rung, told the same re-promotion
    second = attempt(fp32.model_copy(update={"attempt": 1}), tmp_path, stop_at=None)
    assert second.reason == "Repromote" and second.step == 8, (second.reason, second.step, second.message)


def test_a_resume_in_another_precision_than_the_checkpoints_counts_its_clean_steps_from_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf16 = in_process_launch(tmp_path, monkeypatch, JOB, "bf16")
    first = attempt(bf16, tmp_path, stop_at=6)
    assert first.reason == "Preempted" and first.step == 6, first.message
    fp32 = bf16.model_copy(update={"attempt": 1, "precision": "fp32", "repromote_after_steps": 8})
    second = attempt(fp32, tmp_path, stop_at=None)
    assert second.reason == "Repromote" and second.step == 16, (second.reason, second.step, second.message)


BAD_RECORDS = [
    {"step": -1, "precision": "bf16"},
    {"step": "4", "precision": "bf16"},
    {"step": True, "precision": "bf16"},
    {"step": 4, "precision": 16},
    {"step": 4},
    [4],
]


@pytest.mark.parametrize("record", BAD_RECORDS)
def test_an_unusable_last_trouble_record_makes_the_checkpoint_unusable(record: object) -> None:
    assert LastTrouble.state_problem(record) is not None
    assert LastTrouble.state_problem({"step": 0, "precision": "bf16"}) is None


def test_a_fallback_preempted_while_it_runs_the_faulted_steps_again_still_counts_from_the_fault() -> None:
    """bf16 resumed at 4 after fp16 faulted at 8: its checkpoint at 6 records the trouble at 8, and
    an attempt restarted from it in bf16 counts from 8 too, not from 6; in fp16 (a re-promotion
    made of it) from its start."""
    trouble = LastTrouble(lambda: "bf16")
    trouble.resumed(4, faulted_at=8)
    assert trouble.step == 8
    written = trouble.state_dict()
    assert written == {"step": 8, "precision": "bf16"}
    restarted = LastTrouble(lambda: "bf16")
    restarted.load_state_dict(written)
    restarted.resumed(6)
    assert restarted.step == 8
    other = LastTrouble(lambda: "fp16")
    other.load_state_dict(written)
    other.resumed(6)
    assert other.step == 6
