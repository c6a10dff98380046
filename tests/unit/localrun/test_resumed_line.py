"""A rerun says where its trainers really resumed when that is not the checkpoint it planned
(a newer one committed in a bucket after the killed run's last line, or the planned one damaged
and passed over for an older one), as the operator's Resumed Event does."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob.planning.classify import AttemptOutcome
from mpjob_contract import events
from mpjob_contract.report import TerminationReport
from tests.unit.localrun.scripted_run import Killed, Scripted, checkpoint, line, step

pytestmark = pytest.mark.unit


class Rerun(Scripted):
    """A rerun whose trainer prints `lines`, then ends the job."""

    def ending(self) -> AttemptOutcome:
        return AttemptOutcome(0, TerminationReport(reason="Succeeded", step=300, precision="bf16"))


def resume(at: int) -> events.TrainerEvent:
    return line("resume", step=at, path=f"/c/step-{at:09d}", sha256=f"{at:064x}", fromPrecision="bf16")


def test_a_rerun_that_resumes_from_an_older_checkpoint_than_planned_says_so(tmp_path: Path) -> None:
    """It said 'resuming ... from checkpoint step 50' and 'start step 50', then the trainer
    passed step 50 over and resumed from 40, and no line said so (only the summary's steps)."""
    Killed(tmp_path, [step(40), checkpoint(40), step(50), checkpoint(50)]).run()
    rejected = line("checkpointRejected", path="/c/step-000000050", problem="state.pt sha256 mismatch")
    rerun = Rerun(tmp_path, [rejected, resume(40), step(50)])
    status = rerun.run()
    shown: list[str] = rerun.view.lines  # type: ignore[attr-defined]
    said = "attempt 1 (bf16) resumed from checkpoint step 40 (planned: checkpoint step 50)"
    assert said in shown and shown.index(said) > shown.index(
        "checkpoint /c/step-000000050 not used: state.pt sha256 mismatch"
    )
    assert status.attempts[1].start_step == 40


def test_a_rerun_that_resumes_where_it_planned_adds_no_line(tmp_path: Path) -> None:
    Killed(tmp_path, [step(40), checkpoint(40)]).run()
    rerun = Rerun(tmp_path, [resume(40), step(50)])
    rerun.run()
    assert not [text for text in rerun.view.lines if "resumed from" in text]  # type: ignore[attr-defined]
