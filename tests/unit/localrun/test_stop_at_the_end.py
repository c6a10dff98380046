"""A stop that comes as the trainers finish: they had trained every step and ended Succeeded (their
SIGTERM came after their last step), so the job Succeeded; it is not recorded as stopped, nor
resumed by a rerun. The trainers are stood in for by scripted event lines (no process starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob.localrun.stops import Stop
from mpjob.planning.classify import AttemptOutcome
from mpjob_contract.report import TerminationReport
from tests.unit.localrun.scripted_run import Scripted, checkpoint, started, step

pytestmark = pytest.mark.unit


class StoppedAsItEnded(Scripted):
    """The one attempt trains to its last step; the user's Ctrl-C comes as its trainers end Succeeded."""

    def ending(self) -> AttemptOutcome:
        self.ctrl_c.stop = Stop.ASKED
        ref = {"step": 300, "path": str(self.paths.checkpoints / "step-000000300"), "sha256": "ab", "precision": "bf16"}
        report = TerminationReport.model_validate(
            {"reason": "Succeeded", "step": 300, "startStep": 0, "precision": "bf16", "lastGoodCheckpoint": ref}
        )
        return AttemptOutcome(0, report)


def test_a_stop_as_the_trainers_finish_leaves_the_job_succeeded(tmp_path: Path) -> None:
    lines = [started(0), *(step(n) for n in range(10, 301, 10)), checkpoint(300, tmp_path)]
    run = StoppedAsItEnded(tmp_path, lines)
    status = run.run()
    (attempt,) = status.attempts
    assert (status.phase, attempt.reason, attempt.end_step) == ("Succeeded", "Succeeded", 300)
    again = StoppedAsItEnded(tmp_path, lines).run()  # a rerun of the same --out runs nothing
    assert again.phase == "Succeeded" and len(again.attempts) == 1
