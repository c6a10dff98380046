"""runPolicy.progressDeadlineSeconds in `mpjob run`: the operator's rule (mpjob.planning.cutoff)
on what a local run sees of its attempt, worker 0's event lines. Counted from its first line (as
the operator counts from the first read of rank 0's metrics that answers: a trainer still
importing is not judged), anew at each step that moves; once past the deadline the workers are
stopped (SIGTERM; a rank hung where it cannot act on it gets SIGKILL cutoff.CUT_GRACE_SECONDS later,
as the operator cuts a stalled attempt's pods)
and the attempt ends Stalled, to go on in the same precision from the newest checkpoint.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mpjob.localrun.workers import Workers
from mpjob.planning import cutoff
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.observe import moved
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec
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
        """How the attempt ended: Stalled when this watch stopped it, else as its workers said."""
        self._done.set()
        if self.why is None:
            return outcome
        return AttemptOutcome(None, platform_reason=Reason.STALLED.value, message=self.why)

    def _watch(self) -> None:
        while not self._done.wait(POLL_SECONDS):
            still = None if self._moved is None else self._clock() - self._moved
            if (why := cutoff.stall(self.deadline, still, "worker 0's step lines")) is not None:
                self.why = why
                self.workers.stop(cutoff.CUT_GRACE_SECONDS)
                return
