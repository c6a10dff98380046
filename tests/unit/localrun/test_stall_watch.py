"""The stall watch of `mpjob run` (runPolicy.progressDeadlineSeconds) on its own: no trainer
starts; worker 0's lines are scripted and the clock is the test's."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from mpjob.localrun.stall import StallWatch
from mpjob.localrun.workers import Workers
from mpjob.planning import cutoff
from mpjob.planning.backoff import RetryBackoff
from mpjob.planning.classify import AttemptOutcome, classify
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.codes import Reason
from mpjob_contract.report import TerminationReport
from tests.unit.localrun.scripted_run import JOB, Scripted, step

pytestmark = pytest.mark.unit

DEADLINE = 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Stopped(Workers):
    """An attempt's workers, none started, that keep the graces the watch stopped them with."""

    def __init__(self) -> None:
        super().__init__(spec(), folder=Path("/nonexistent"), cwd=Path("/nonexistent"), python=sys.executable)
        self.graces: list[float] = []

    def stop(self, grace: float) -> None:
        self.graces.append(grace)


def spec() -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({**JOB["spec"], "runPolicy": {"progressDeadlineSeconds": DEADLINE}})


def stalled_watch() -> tuple[StallWatch, Stopped]:
    """A watch that saw step 20, then nothing for longer than the deadline, and stopped the workers."""
    clock, workers = Clock(), Stopped()
    watch = StallWatch(spec(), workers, clock=clock)
    watch.seen(step(20))
    clock.now += DEADLINE - 1
    assert not watch.check() and workers.graces == []
    clock.now += 2
    assert watch.check() and workers.graces == [cutoff.CUT_GRACE_SECONDS]
    return watch, workers


#: What the stalled trainers wrote once stopped (they could still act on SIGTERM): where they
#: stopped, their own history of the attempt, and how long the attempt took to resume.
SAID = TerminationReport.model_validate(
    {
        "reason": "Preempted",
        "step": 25,
        "startStep": 0,
        "precision": "bf16",
        "recoverySeconds": 7.5,
        "lossScales": [[10, 1024.0], [20, 512.0]],
        "message": "SIGTERM honoured at step 25",
    }
)


def test_a_stalled_attempt_keeps_what_its_trainers_reported_when_stopped() -> None:
    """The operator records a stalled attempt's report once its pods stopped (`cutoff.heard`):
    where it stopped, its recoverySeconds, its loss-scale history. `mpjob run` dropped it."""
    watch, _ = stalled_watch()
    ended = watch.ended(AttemptOutcome(44, SAID))
    assert ended.report is not None, "the trainers' report was dropped"
    assert (ended.report.step, ended.report.recovery_seconds, ended.report.loss_scales) == (
        25,
        7.5,
        [(10, 1024.0), (20, 512.0)],
    )
    verdict = classify(ended)
    assert verdict.reason is Reason.STALLED and verdict.message == watch.why  # the stall's words, not SIGTERM's


class StalledThenDone(Scripted):
    """Attempt 0 stalls at step 20 (its trainers report on SIGTERM), attempt 1 succeeds."""

    def __init__(self, out: Path) -> None:
        super().__init__(out, [step(10), step(20)])
        self.retries = RetryBackoff(base=0)

    def ending(self) -> AttemptOutcome:
        assert self._current is not None
        if self._current.index == 0:
            watch, _ = stalled_watch()
            return watch.ended(AttemptOutcome(44, SAID))
        return AttemptOutcome(0, TerminationReport(reason="Succeeded", step=300, precision="bf16"))


def test_a_stalled_attempts_report_reaches_its_status_entry(tmp_path: Path) -> None:
    status = StalledThenDone(tmp_path).run()
    stalled, done = status.attempts
    assert (stalled.reason, done.reason, status.phase) == ("Stalled", "Succeeded", "Succeeded")
    assert (stalled.end_step, stalled.recovery_seconds) == (25, 7.5)
    assert status.timeline is not None and [(p.attempt, p.step) for p in status.timeline.loss_scale] == [
        (0, 10),
        (0, 20),
    ]


def test_an_attempt_the_user_is_stopping_is_not_cut_as_stalled_while_it_checkpoints() -> None:
    """The first Ctrl-C (or SIGTERM) asks the trainers to checkpoint and stop; their step stands
    still while they save. The watch went on counting and cut them (SIGKILL 10 s on) once the
    deadline passed, so the save the user asked for was lost without a second Ctrl-C, and the
    attempt ended Stalled. The operator judges a stall only while the attempt runs: one it is
    ending (a suspension, a resize, the job's deadline, a crash's cut) keeps its pods' grace."""
    clock, workers = Clock(), Stopped()
    watch = StallWatch(spec(), workers, clock=clock)
    watch.seen(step(20))
    clock.now += DEADLINE - 5
    workers.signal(signal.SIGTERM)  # as the Ctrl-C handler passes the press on (stops.CtrlC.press)
    clock.now += 10  # saving
    watch.check()
    assert workers.graces == [] and watch.why is None
    ended = watch.ended(AttemptOutcome(44, SAID))
    assert ended.report is SAID and ended.platform_reason is None
