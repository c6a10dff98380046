"""`mpjob run --workers-available SCHEDULE`: a simulated cluster whose capacity changes with the
steps trained, so that a local run of an elastic job (spec.elastic) shrinks and grows through
the operator's decision (mpjob.planning.elastic) without a cluster.

SCHEDULE is `N[,STEP:N]...`: N workers fit from the start, and from each STEP on the N after it
(`3,40:2,120:3`: 3 at first, 2 from step 40, 3 from step 120), the steps counted as the furthest
the job has reached (steps trained again after a resume come later). The runner reads the trainer's
steps from its event lines (a line per training.logEvery steps) and acts on a change when it reads
the first logged step at or after its STEP; the trainers do not wait for that read, so the change
lands at the step they have reached by then, which may be further. When fewer workers fit than
an attempt runs with, the last workers' processes are killed, as when their nodes go away: the
attempt ends and the next one runs with as many as fit, from the last checkpoint. When more fit
again, the attempt ends at its next checkpoint (SIGTERM, which the trainer honours with a
checkpoint) and the next one runs with more; when the room goes before that checkpoint, the
growth is called off. A local run has no time to wait in: pods that do not fit at an attempt's
start count as unschedulable past elastic.waitSeconds; a count below elastic.minWorkers, or one
at which no size keeps the global batch, is refused.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass, replace

from mpjob.localrun.workers import Workers
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.elastic import (
    Capacity,
    Resize,
    Verdict,
    decide,
    global_batch,
    grows_at,
    growth_micro_batch,
    shape_for,
    shape_of,
)
from mpjob.planning.planner import BatchShape, StartAttempt
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus


class BadSchedule(ValueError):
    """A --workers-available value that cannot be read or cannot work for the job."""


@dataclass
class WorkersSchedule:
    #: (from step, workers that fit), ascending by step, the first from step 0.
    changes: tuple[tuple[int, int], ...]
    #: The furthest step the job has reached: the schedule's clock. An attempt resumed from a
    #: checkpoint before it trains those steps again later in time, under the capacity of now.
    reached: int = 0

    @classmethod
    def parse(cls, text: str) -> WorkersSchedule:
        """`N[,STEP:N]...` (module doc)."""
        parts = [p.strip() for p in text.split(",")]
        try:
            changes = [(0, int(parts[0]))]
            for part in parts[1:]:
                step, workers = part.split(":")
                changes.append((int(step), int(workers)))
        except ValueError:
            raise BadSchedule(f"{text!r}: expected N[,STEP:N]... (e.g. 3,40:2,120:3)") from None
        steps = [step for step, _ in changes]
        if steps != sorted(set(steps)) or any(workers < 1 for _, workers in changes):
            raise BadSchedule(f"{text!r}: steps must rise from 0 and each count of workers be at least 1")
        return cls(tuple(changes))

    def available(self, step: int) -> int:
        """Workers that fit with the job at `step` (the clock moves on to it; a step trained
        again after a resume does not turn it back)."""
        self.reached = max(self.reached, step)
        return next(workers for since, workers in reversed(self.changes) if self.reached >= since)

    def now(self) -> int:
        """Workers that fit at the furthest step the job has reached."""
        return self.available(self.reached)

    def check(self, spec: MixedPrecisionJobSpec) -> None:
        """A local run cannot wait for capacity: every count must reach elastic.minWorkers, and one
        below `workers` must hold a size from there that keeps the global batch."""
        if spec.elastic is None:
            raise BadSchedule("needs spec.elastic: without it every attempt has `workers` pods")
        least = spec.elastic.min_workers
        for step, workers in self.changes:
            if workers < least:
                raise BadSchedule(
                    f"{workers} worker(s) from step {step} is fewer than elastic.minWorkers={least}:"
                    " a local run has no cluster to wait for"
                )
            sizes = range(least, min(workers, spec.workers - 1) + 1)
            if workers < spec.workers and all(shape_for(spec, n, spec.training.batch_size) is None for n in sizes):
                raise BadSchedule(
                    f"{workers} worker(s) from step {step}: no size from elastic.minWorkers={least} up keeps the"
                    f" global batch of {global_batch(spec)} samples: a local run has no cluster to wait for"
                )


def at_start(spec: MixedPrecisionJobSpec, schedule: WorkersSchedule, start: StartAttempt) -> Resize:
    """The attempt as it starts: pods that do not fit now count as unschedulable past waitSeconds."""
    workers, fits = start.workers or spec.workers, schedule.available(start.start_step)
    capacity = Capacity(fits, unschedulable_seconds=math.inf if fits < workers else 0.0)
    return decide(spec, workers=workers, shape=start.shape or BatchShape.of(spec), capacity=capacity)


class CapacityWatch:
    """Follows one attempt's steps against the schedule and ends the attempt when the job resizes."""

    def __init__(
        self,
        spec: MixedPrecisionJobSpec,
        schedule: WorkersSchedule,
        start: StartAttempt,
        workers: Workers,
        status: MixedPrecisionJobStatus,
    ) -> None:
        self.spec, self.schedule, self.workers, self.start, self.status = spec, schedule, workers, start, status
        self.count = start.workers or spec.workers
        #: The size the job goes on with once this attempt has ended (None: it was not resized).
        self.resize: Resize | None = None
        self._grow: Resize | None = None

    def ended(self, outcome: AttemptOutcome) -> AttemptOutcome:
        """How the attempt ended, with the size the job goes on with when this watch resized it."""
        return replace(outcome, resize=self.resize)

    def seen(self, event: events.TrainerEvent) -> None:
        if self.resize is not None or not isinstance(event, events.Step | events.Checkpoint):
            return
        fits = self.schedule.available(event.step)
        lost = fits < self.count
        capacity = Capacity(fits, node_lost=lost)
        shape, grow_micro = self._running()
        resize = decide(self.spec, workers=self.count, shape=shape, capacity=capacity, grow_micro=grow_micro)
        if resize.verdict is Verdict.SHRINK:
            self.resize = resize
            self.workers.kill_last(self.count - fits)  # their nodes went away
        elif resize.verdict is Verdict.GROW and self._grow is not None and self._stops_here(event):
            self.resize = resize  # its next checkpoint is written: stop it there, and grow to what fits now
            self.workers.signal(signal.SIGTERM)
        else:
            self._grow = resize if resize.verdict is Verdict.GROW else None  # the room went: growth called off

    def _running(self) -> tuple[BatchShape, int]:
        """The batch shape of the attempt running now, and a grown attempt's largest micro-batch
        (below those the job's attempts ran out of memory in). Read at each decision from the job's
        newest attempt, as the operator's `grows` reads it: a change in place (a micro-batch split,
        a fallback) goes on in these processes as a newer attempt, and a resize from the shape or
        precision it started in would take back a micro-batch that just ran out of memory."""
        newest = self.status.attempts[-1] if self.status.attempts else None
        attempt = newest if newest is not None and newest.index >= self.start.index else self.start
        return shape_of(attempt) or BatchShape.of(self.spec), growth_micro_batch(
            self.spec, attempt.precision, self.status
        )

    def _stops_here(self, event: events.TrainerEvent) -> bool:
        """A checkpoint a growth may stop the attempt at (not its last: it ends Succeeded there)."""
        return isinstance(event, events.Checkpoint) and grows_at(self.spec, event.step)


def unschedulable(
    spec: MixedPrecisionJobSpec, schedule: WorkersSchedule | None, start: StartAttempt
) -> AttemptOutcome | None:
    """The ending of an attempt whose pods do not all fit at its start (None: it runs): it ends
    before a trainer starts, and the job goes on with as many workers as fit."""
    if schedule is None or (resize := at_start(spec, schedule, start)).verdict is not Verdict.SHRINK:
        return None
    return AttemptOutcome(None, message=resize.why, resize=resize)
