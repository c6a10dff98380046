"""A rerun stopped by Ctrl-C before its trainers trained a step: the launcher's report carries no
progress (its ranks were killed by the SIGTERM before their session caught it), and the summary
says where the attempt began and that it stopped before training, not an unknown end."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob.localrun.stops import Stop
from mpjob.planning.classify import AttemptOutcome
from mpjob.summary import summary_lines
from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from tests.unit.localrun.scripted_run import Killed, Scripted, checkpoint, started, step

pytestmark = pytest.mark.unit

#: The report the launcher makes for ranks a SIGTERM killed before they trained (launch.fold).
UNTRAINED = "local rank 0 (rank 0) was killed by SIGTERM before it trained (nothing to checkpoint)"


class StoppedBeforeTraining(Scripted):
    """A rerun whose one attempt prints `lines`, then ends on the first Ctrl-C with the
    launcher's report of ranks that trained nothing."""

    def ending(self) -> AttemptOutcome:
        self.ctrl_c.stop = Stop.ASKED
        report = TerminationReport(reason="Preempted", message=UNTRAINED)  # step 0, no startStep
        return AttemptOutcome(int(ExitCode.PREEMPTED), report)


def test_a_rerun_stopped_before_it_trained_says_so_where_it_said_an_unknown_end(tmp_path: Path) -> None:
    """Before: `attempt 1: bf16 steps 145-?`, its endStep 0 from the report without progress."""
    Killed(tmp_path, [started(0), step(140), checkpoint(145), step(150)]).run()
    rerun = StoppedBeforeTraining(tmp_path, [started(145)])
    status = rerun.run()
    first, second = status.attempts
    assert (second.start_step, second.end_step, second.reason) == (145, 145, "Suspended")
    assert status.step == 145 and status.last_checkpoint is not None and status.last_checkpoint.step == 145
    line = summary_lines("job", status)[2]
    assert line.startswith("  attempt 1: bf16 step 145, stopped before training Suspended (stopped by Ctrl-C")
    assert "-?" not in line
    assert summary_lines("job", status)[1] == f"  attempt 0: bf16 steps 0-150 Suspended ({first.message})"
