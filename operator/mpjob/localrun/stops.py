"""The user's stop of a local run, by Ctrl-C or SIGTERM (`kill PID`, `timeout`, `docker stop`): the
first asks the trainers to checkpoint and stop (SIGTERM: they save, write their termination report
and exit); a second kills them (SIGKILL: no checkpoint, no report). What the run records of a stop
is what it saw: an attempt killed before its trainers reported ends where its own event lines put
it, and its message names the checkpoint a rerun resumes from, the newest one known to be
committed, or none. The stop the manifest asks for, runPolicy.suspend, starts no attempt (`held`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from mpjob.localrun.signal_relay import SignalRelay
from mpjob.planning import lifecycle as lc
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.plan import Plan, When
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJobStatus
from mpjob_contract.report import TerminationReport

if TYPE_CHECKING:
    from mpjob.localrun.progress import ProgressView
    from mpjob.localrun.workers import Workers


class Stop(Enum):
    """Where the user's stop of the current attempt stands."""

    NONE = "none"  # no Ctrl-C yet
    ASKED = "asked"  # one Ctrl-C: the trainers were asked to checkpoint and stop
    KILLED = "killed"  # a second Ctrl-C: the trainers were killed


@dataclass(frozen=True)
class Press:
    """What one Ctrl-C does: the state it leads to, the signal the workers get, the line shown."""

    stop: Stop
    signal: int
    line: str


ASKED_LINE = "interrupted: asking the trainer to checkpoint and stop (Ctrl-C again to kill)"
TERMINATED_LINE = (
    "terminated (SIGTERM): asking the trainer to checkpoint and stop (a second SIGTERM or Ctrl-C kills it)"
)
#: What each stop signal is called in the run's lines and messages.
CALLED: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
#: A press while no attempt's trainers run (the runner between two attempts).
BETWEEN_LINE = "interrupted: stopping before the next attempt starts"


def pressed(stop: Stop, sig: int = signal.SIGINT) -> Press:
    """A stop signal `sig` (Ctrl-C's SIGINT, or SIGTERM) in state `stop`: the first asks the
    trainers (SIGTERM), any later one kills them (SIGKILL)."""
    if stop is Stop.NONE:
        return Press(Stop.ASKED, signal.SIGTERM, ASKED_LINE if sig == signal.SIGINT else TERMINATED_LINE)
    return Press(
        Stop.KILLED, signal.SIGKILL, f"second {CALLED[sig]}: killing the trainers; no checkpoint is written now"
    )


class CtrlC:
    """The user's Ctrl-C while a run goes on: a handler, not a KeyboardInterrupt (one raised
    wherever the runner stood would skip the trainers' checkpoint, or leave report.json behind
    what happened), each press passed on to the workers running (`pressed`) and shown at once;
    between attempts it stops the run before the next one starts.

    The handler (`press`) runs in the main thread between two bytecodes, wherever it stood: it
    only records the press (attribute writes), signals the workers (os.kill) and posts its line
    to a `SignalRelay`, whose thread shows it and wakes `pause`; it takes no lock and prints
    nothing (`signal_relay` says what that did)."""

    def __init__(self, view: ProgressView) -> None:
        self.view = view
        self.stop = Stop.NONE
        self.by = CALLED[signal.SIGINT]  # what the latest stop was: Ctrl-C or SIGTERM
        self._last: Press | None = None  # the latest press
        self._relay: SignalRelay | None = None  # the outermost `caught`'s, while it runs
        self._pressed = threading.Event()  # ends a `pause`: set by the relay's thread, never the handler

    @contextlib.contextmanager
    def caught(self, workers: Workers | None = None) -> Iterator[None]:
        """Ctrl-C stops `workers` for as long as the block runs (their lines, then their endings);
        without workers, it only records the stop (the runner ends the run at the next attempt).
        A press that came as the workers started, before the block, reaches them as it begins.
        Every press's line is shown by the block's end."""
        relay = None
        if self._relay is None:
            relay = self._relay = SignalRelay(self._say)
        previous = {sig: signal.signal(sig, lambda got, _: self.press(workers, got)) for sig in CALLED}
        if workers is not None and self._last is not None:
            workers.signal(self._last.signal)
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if relay is not None:
                self._relay = None
                relay.close()
            elif self._relay is not None:
                self._relay.settle()  # the block's presses are said before what the run says of its end

    def held_back(self) -> AttemptOutcome | None:
        """The ending of the next attempt, not started: the user stopped the run before it (None: it starts)."""
        return None if self.stop is Stop.NONE else AttemptOutcome(None)

    def stop_asked(self) -> bool:
        return self.stop is not Stop.NONE

    def pause(self, seconds: float) -> None:
        """Sleep `seconds` between attempts, or until the user's stop (within `caught`)."""
        self._pressed.wait(seconds)

    def press(self, workers: Workers | None, sig: int = signal.SIGINT) -> None:
        """The signal handler (within `caught`): no lock, no print, whatever the main thread was doing."""
        press = self._last = pressed(self.stop, sig)
        self.stop, self.by = press.stop, CALLED[sig]
        if self._relay is not None:
            self._relay.post(press.line if workers is not None else BETWEEN_LINE)
        if workers is not None:
            workers.signal(press.signal)  # Popen.send_signal: os.kill, its poll never waits for a lock

    def _say(self, line: str) -> None:
        """A press's line, from the relay's thread: `pause` ends, then the line is shown."""
        self._pressed.set()
        self.view.info(line)


def stop_message(
    stop: Stop,
    report: TerminationReport | None,
    checkpoint: CheckpointStatus | None,
    *,
    started: bool = True,
    by: str = CALLED[signal.SIGINT],
) -> str:
    """The message of an attempt the user stopped, from what the run saw: the trainers' `report`
    names the checkpoint they stopped after (their last good one), or that they wrote none, and a
    rerun then resumes from `checkpoint`, an earlier attempt's, if any; without
    a report (a second Ctrl-C killed them, they ended without one, or the attempt was not
    `started`), `checkpoint` is the newest one known committed (a line or its manifest said so), if any.
    `by`: what stopped it, Ctrl-C or SIGTERM."""
    rerun = "a rerun with the same --out"
    if report is not None:
        if report.last_good_checkpoint is None and checkpoint is not None:  # an earlier attempt's stands
            return f"stopped by {by} before a checkpoint of its own; {rerun} resumes from {checkpoint_name(checkpoint)}"
        if report.last_good_checkpoint is None:
            return f"stopped by {by} before any checkpoint; {rerun} starts over"
        return f"stopped by {by} after the checkpoint of step {report.last_good_checkpoint.step}; {rerun} resumes"
    how = f"killed by a second {by} before the trainers finished stopping"
    if not started:
        how = f"stopped by {by} before it started"
    elif stop is Stop.ASKED:
        how = f"stopped by {by}; the trainers ended without a report"
    then = "starts over: no checkpoint" if checkpoint is None else f"resumes from {checkpoint_name(checkpoint)}"
    return f"{how}; {rerun} {then}"


def checkpoint_name(checkpoint: CheckpointStatus) -> str:
    return f"checkpoint step {checkpoint.step}"


def resume_line(name: str, root: Path, checkpoint: CheckpointStatus | None) -> str:
    """What a rerun of the same --out says before its first attempt (`lifecycle.resume` starts it
    at the last checkpoint's step, or at 0 with none)."""
    if checkpoint is None:
        return f"resuming {name} in {root}, starting over: no checkpoint"
    return f"resuming {name} in {root} from checkpoint step {checkpoint.step}"


def ended_line(report: Path, status: MixedPrecisionJobStatus, steps: int) -> str:
    """What a rerun of a run that already ended says (it runs nothing): use --fresh, naming the
    run's training.steps and the manifest's (`steps`) when they differ."""
    said = f"{report} says this run already ended {status.phase}"
    if status.total_steps is None or status.total_steps == steps:
        return f"{said}; use --fresh"
    why = "a run's checkpoints hold to its own settings"
    return f"{said}; its training.steps was {status.total_steps}, this manifest's is {steps} ({why}): use --fresh"


def held(plan: Plan, when: When, root: Path) -> str:
    """runPolicy.suspend: the job is recorded Suspended, no attempt starts (as the operator starts
    none); the message, also the status's, says how to run it."""
    message = (
        "suspended by runPolicy.suspend: no attempt starts; set runPolicy.suspend to false "
        f"and run `mpjob run` again with the same --out ({root})"
    )
    lc.suspend(plan, when, message)
    plan.status.message = message
    return message
