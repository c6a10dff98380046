"""`mpjob run` killed (SIGKILL, a closed terminal) while it waited to start the attempt that retries
a failure: that attempt was recorded, its trainers never started. The rerun of the same --out ends
it as one that never started, not as one whose trainers died with the runner. The trainers are
stood in for by scripted event lines (no process starts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob.localrun import runner
from mpjob.planning.classify import AttemptOutcome
from mpjob.summary import summary_lines
from mpjob_contract.report import TerminationReport
from tests.unit.localrun.scripted_run import Scripted, checkpoint, started, step

pytestmark = pytest.mark.unit


class RunnerKilled(Exception):
    """Stands in for the SIGKILL: the runner stops where it stood, its report as last saved."""


class Crashed(Scripted):
    def ending(self) -> AttemptOutcome:
        return AttemptOutcome(1, None, message="the trainer exited 1 without a report")


class Finished(Scripted):
    def ending(self) -> AttemptOutcome:
        return AttemptOutcome(0, TerminationReport(reason="Succeeded", step=300, startStep=50, precision="bf16"))


def test_an_attempt_the_runner_was_killed_before_starting_is_not_said_to_have_had_trainers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: `attempt 1 ... Suspended (the local run was killed and its trainers with it ...)`
    for an attempt that never ran a trainer."""

    waits: list[None] = []

    def killed(*args: object, **kwargs: object) -> None:
        if waits:  # the wait before attempt 1, which retries attempt 0's crash
            raise RunnerKilled
        waits.append(None)

    with monkeypatch.context() as patched:
        patched.setattr(runner, "wait_out", killed)
        with pytest.raises(RunnerKilled):
            Crashed(tmp_path, [started(0), step(40), checkpoint(50, tmp_path), step(60)]).run()
    shown = Finished(tmp_path, [started(50), step(300)])
    status = shown.run()
    first, never, last = status.attempts
    assert [first.reason, never.reason, last.reason] == ["InfraError", "Suspended", "Succeeded"]
    assert status.phase == "Succeeded"
    assert never.message is not None and "trainers" not in never.message, never.message
    assert "before this attempt started" in never.message
    assert shown.view.lines[0] == f"attempt 1 ended: Suspended: {never.message}", shown.view.lines
    assert summary_lines("job", status)[2].startswith("  attempt 1: bf16 step 50, stopped before training Suspended")
