"""runPolicy's deadlines in `mpjob run`.

progressDeadlineSeconds: the operator's rule (mpjob.planning.cutoff) on what a local run sees of
its attempt, worker 0's event lines. Counted from its first line (as the operator counts from the
first read of rank 0's metrics that answers: a trainer still importing is not judged), anew at
each step that moves; once past the deadline the workers are stopped (SIGTERM; a rank hung where
it cannot act on it gets SIGKILL cutoff.CUT_GRACE_SECONDS later, as the operator cuts a stalled
attempt's pods) and the attempt ends Stalled, to go on in the same precision from the newest
checkpoint.

activeDeadlineSeconds: the job's whole deadline, counted from its start (status.startTime, as the
operator counts it). Each attempt gets what is left of it, at least a second (the operator's rule
for an attempt Job's own activeDeadlineSeconds, `status.deadline_left`); when that runs out its
workers are stopped as the Job controller stops the pods (SIGTERM: the trainers checkpoint;
SIGKILL a pod's grace later) and the attempt ends DeadlineExceeded, which fails the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from mpjob.builders.attempt import TERMINATION_GRACE_SECONDS
from mpjob.localrun.workers import Workers
from mpjob.planning import cutoff
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.endings import past_deadline, stopped_by
from mpjob.planning.observe import moved
from mpjob.planning.status import deadline_left
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason

#: How often the watch looks at the clock.
POLL_SECONDS = 1.0


class StallWatch:
    """Watches one attempt's steps; stops its workers when they stand still past the deadline."""

    def __init__(self, spec: MixedPrecisionJobSpec, workers: Workers, clock: Callable[[], float] = time.monotonic):
        self.deadline, self.workers, self._clock = spec.run_policy.progress_deadline_seconds, workers, clock
        self._step: int | None = None
        self._moved: float | None = None  # None: no line yet
        #: Why the attempt was stopped (None: it was not).
        self.why: str | None = None
        self._done = threading.Event()
        if self.deadline is not None:
            threading.Thread(target=self._watch, name="mpjob-stall-watch", daemon=True).start()

    def seen(self, event: events.TrainerEvent) -> None:
        step = event.step if isinstance(event, events.Step) else self._step
        if moved(self._step, self._moved, step):  # the operator's rule
            self._step, self._moved = step, self._clock()

    def ended(self, outcome: AttemptOutcome) -> AttemptOutcome:
        """How the attempt ended: Stalled when this watch stopped it, else as its workers said.
        Stalled with what its trainers reported if they could still act on SIGTERM (where they
        stopped, their recoverySeconds, loss-scale history and counters), as the operator records
        a stalled attempt's report once its pods stopped (`cutoff.heard`), less its message: the
        stall, not the SIGTERM, ended it."""
        self._done.set()
        if self.why is None:
            return outcome
        return stopped_by(AttemptOutcome(None, platform_reason=Reason.STALLED.value, message=self.why), outcome)

    def check(self) -> bool:
        """Stop the workers if their step has stood still past the deadline; whether the watch is
        done: it stopped them, or they are being stopped already. The operator judges a stall only
        while the attempt runs: one it is ending (a suspension, a resize, the deadline, a crash's
        cut) keeps its pods' grace, and a trainer that checkpoints on the user's Ctrl-C, its step
        standing still while it saves, was cut here, the save it was asked for lost."""
        if self.workers.stopping:
            return True
        still = None if self._moved is None else self._clock() - self._moved
        if (why := cutoff.stall(self.deadline, still, "worker 0's step lines")) is None:
            return False
        self.why = why
        self.workers.stop(cutoff.CUT_GRACE_SECONDS)
        return True

    def _watch(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            if self.check():
                return


class DeadlineWatch:
    """Stops one attempt's workers once what is left of the job's deadline has passed."""

    def __init__(self, spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, workers: Workers) -> None:
        self.workers = workers
        left = deadline_left(spec, status, datetime.now(UTC))
        #: Whether the deadline stopped the attempt.
        self.passed = False
        self._done = threading.Event()
        if left is not None:
            threading.Thread(target=self._watch, args=(left,), name="mpjob-deadline-watch", daemon=True).start()

    def seen(self, event: events.TrainerEvent) -> None:
        """The deadline counts wall time, whatever the trainers say."""

    def ended(self, outcome: AttemptOutcome) -> AttemptOutcome:
        """How the attempt ended: DeadlineExceeded when this watch stopped it, else as it said."""
        self._done.set()
        return past_deadline(outcome) if self.passed else outcome

    def _watch(self, left: int) -> None:
        if not self._done.wait(left):
            self.passed = True
            self.workers.stop(TERMINATION_GRACE_SECONDS)
