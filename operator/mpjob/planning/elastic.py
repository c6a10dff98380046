"""Elastic world size (spec.elastic), decided once: keep the attempt, shrink it, or grow it.

Pure: the operator (from what the cluster shows: unschedulable pods, lost nodes, free GPUs or
queue quota) and `mpjob run` (from its --workers-available schedule) read the cluster into a
`Capacity` and call `decide`; neither re-implements the rule.

- Shrink: the attempt's pods stayed unschedulable past elastic.waitSeconds, its Job waited
  suspended in a queue short of quota that long, a ResourceQuota of its namespace kept some of its
  pods from being created that long, or it lost a node, and the cluster (the queue's free quota,
  the pods the quota let be made) holds fewer workers than it runs with: the next attempt runs with
  as many as it holds, in the same precision, from the last good checkpoint (fewer than
  minWorkers: it waits).
- Grow: the cluster holds more workers than the attempt runs with and it runs below `workers`:
  the attempt ends at its next checkpoint and the next one runs with more, up to `workers`.

The global batch (samples per optimizer step over all processes: workers x processesPerWorker
x batchSize x gradAccumulation, as the spec says) is kept at every size: each process takes
global / world samples per step, split into micro-batches of at most the attempt's micro-batch
(shrinking never makes a micro-batch larger; growing may take it back up to batchSize, but not
to one the job ran out of device memory in, nor past fp32's split of precision.fallbackKeepsBatch:
mpjob.planning.batch, whose rule a re-promotion follows too) with the accumulation making up the
rest. A size whose world does not divide the global batch is skipped. The data order is
addressed by samples, not steps (mpjob_trainer.data.StepSampler): a resume at another world
size goes on with the very next sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from mpjob.planning import history
from mpjob.planning.batch import BatchShape, global_batch, largest_micro_batch, shape_for
from mpjob.planning.classify import Action, AttemptOutcome, classify, under_policy
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus, processes_per_worker
from mpjob_contract.codes import Reason


class Held(StrEnum):
    """What keeps an attempt's pods from running: the scheduler (no node for them), the queue (its
    Job waits suspended to be admitted) or a ResourceQuota (the Job controller may not create them)."""

    SCHEDULER = "scheduler"
    QUEUE = "queue"
    QUOTA = "quota"

    @property
    def room(self) -> str:
        return {Held.QUEUE: "the queue's free quota", Held.QUOTA: "the namespace's ResourceQuota"}.get(
            self, "the cluster"
        )

    @property
    def waiting(self) -> str:
        """What waited, as a shrink's message says it."""
        if self is Held.QUEUE:
            return "its Job waited for its queue's quota"
        return "pods refused by a ResourceQuota" if self is Held.QUOTA else "pods unschedulable"


@dataclass(frozen=True)
class Capacity:
    """What the cluster shows of room for the attempt, now."""

    #: Workers the cluster can hold now, the attempt's own running pods included.
    available: int
    #: Seconds the attempt's pods have been unschedulable (0: all scheduled or running; inf: at
    #: the start of a local run, which has no time to wait in).
    unschedulable_seconds: float = 0.0
    #: The attempt lost a node while training (a pod's node went away).
    node_lost: bool = False
    #: What holds the attempt short of room, and so what the room is.
    held: Held = Held.SCHEDULER


class Verdict(StrEnum):
    KEEP = "Keep"
    SHRINK = "Shrink"
    GROW = "Grow"
    #: Short of room, but no size from elastic.minWorkers up to what fits keeps the global batch.
    WAIT = "Wait"


@dataclass(frozen=True)
class Resize:
    verdict: Verdict
    #: Workers (pods) of the next attempt; the current attempt's when kept.
    workers: int
    #: Its batch shape per process: the global batch kept.
    shape: BatchShape
    #: For the status and Events.
    why: str

    @property
    def reason(self) -> Reason | None:
        """The reason the resized attempt ends with (None: kept)."""
        return {Verdict.SHRINK: Reason.SCALED_DOWN, Verdict.GROW: Reason.SCALED_UP}.get(self.verdict)

    @property
    def short(self) -> str | None:
        """Why the attempt, short of room, keeps its size (None: it does not wait)."""
        return self.why if self.verdict is Verdict.WAIT else None


#: The reasons an attempt ends with when the job changes size.
RESIZE_REASONS = frozenset({Reason.SCALED_DOWN, Reason.SCALED_UP})
#: How a shrink for a lost node begins its message: its peers were cut (`lost_a_node`).
NODE_LOST = "a node was lost"


def lost_a_node(attempt: AttemptStatus) -> bool:
    """Whether `attempt` ended shrunk because a node of its went away (its peers, blocked on the
    lost rank, were cut: `cutoff.sweep` cuts them so too when it carries the ending out)."""
    return attempt.reason == Reason.SCALED_DOWN and (attempt.message or "").startswith(NODE_LOST)


def workers_of(spec: MixedPrecisionJobSpec, attempt: AttemptStatus | StartAttempt) -> int:
    """The workers an attempt runs with: planned, or as recorded (an older record's world size over
    the spec's processesPerWorker; spec.workers if none)."""
    if isinstance(attempt, StartAttempt):
        return attempt.workers or spec.workers
    if attempt.workers is not None:
        return attempt.workers
    if attempt.world_size is None:
        return spec.workers
    return max(1, attempt.world_size // processes_per_worker(spec))


def _largest(spec: MixedPrecisionJobSpec, sizes: range, max_micro: int) -> tuple[int, BatchShape] | None:
    for workers in reversed(sizes):
        if (shape := shape_for(spec, workers, max_micro)) is not None:
            return workers, shape
    return None


def growth_micro_batch(spec: MixedPrecisionJobSpec, precision: str, status: MixedPrecisionJobStatus) -> int:
    """The largest micro-batch a grown attempt in `precision` may take (batch.largest_micro_batch,
    the rule a re-promotion's shape follows too): growing does not undo a split that keeps the
    job within memory."""
    return largest_micro_batch(spec, precision, status.attempts, history.counts(status))


def decide(
    spec: MixedPrecisionJobSpec, *, workers: int, shape: BatchShape, capacity: Capacity, grow_micro: int | None = None
) -> Resize:
    """Keep, shrink or grow the attempt that runs with `workers` pods in `shape` (module doc), or
    wait when it is short of room that no smaller size takes; a grown one's micro-batches of at
    most `grow_micro` (None: training.batchSize; growth_micro_batch)."""
    elastic = spec.elastic
    keep = Resize(Verdict.KEEP, workers, shape, f"{workers} worker(s), {capacity.available} available")
    if elastic is None:
        return keep
    if capacity.available > workers and workers < spec.workers:
        sizes = range(workers + 1, min(capacity.available, spec.workers) + 1)
        if (found := _largest(spec, sizes, grow_micro or spec.training.batch_size)) is not None:
            more, bigger = found
            why = f"the cluster holds {capacity.available} worker(s) again: {workers} -> {more}"
            return Resize(Verdict.GROW, more, bigger, why)
        return keep
    short = capacity.node_lost or capacity.unschedulable_seconds > elastic.wait_seconds
    if not short or capacity.available >= workers:
        return keep
    cause = NODE_LOST if capacity.node_lost else _waited(capacity, elastic.wait_seconds)
    room = capacity.held.room
    sizes = range(elastic.min_workers, min(capacity.available, workers - 1) + 1)
    if (found := _largest(spec, sizes, shape.micro_batch)) is None:  # said as it stands, not how long
        why = f"{room} holds {capacity.available} of {workers} worker(s): {_no_size(spec, workers, sizes)}: waiting"
        return Resize(Verdict.WAIT, workers, shape, why)
    fewer, smaller = found
    why = f"{cause}; {room} holds {capacity.available} worker(s): {workers} -> {fewer}"
    return Resize(Verdict.SHRINK, fewer, smaller, why)


def _no_size(spec: MixedPrecisionJobSpec, workers: int, sizes: range) -> str:
    """Why the attempt of `workers` pods takes none of `sizes` (elastic.minWorkers up to what fits)."""
    least = f"elastic.minWorkers={sizes.start}"
    if sizes.start >= workers:
        return f"{least} allows no fewer than {workers}"
    batch = f"no size from {least} up keeps the global batch of {global_batch(spec)} samples"
    return batch if sizes else f"that is fewer than {least}"


def _waited(capacity: Capacity, wait_seconds: int) -> str:
    """How long the attempt waited for room (unbounded: at a local run's start, which does not wait)."""
    held = capacity.held.waiting
    if math.isinf(capacity.unschedulable_seconds):
        return f"{held} at the attempt's start (a local run does not wait out elastic.waitSeconds={wait_seconds})"
    return f"{held} for {capacity.unschedulable_seconds:.0f}s (elastic.waitSeconds={wait_seconds})"


# ---------------------------------------------------------------- what the cluster shows (operator)


def shape_of(attempt: AttemptStatus | StartAttempt) -> BatchShape | None:
    """The batch shape an attempt ran with (None: spec.training's, or not recorded)."""
    if attempt.micro_batch is None or attempt.grad_accumulation is None:
        return None
    return BatchShape(attempt.micro_batch, attempt.grad_accumulation)


def _shape(spec: MixedPrecisionJobSpec, attempt: AttemptStatus) -> BatchShape:
    return shape_of(attempt) or BatchShape.of(spec)


def next_size(
    spec: MixedPrecisionJobSpec, attempt: AttemptStatus | StartAttempt, resize: Resize | None
) -> tuple[int, BatchShape | None]:
    """The workers and batch shape of the attempt after `attempt`: the resize's; else the shape
    `attempt` ran in, on the workers it ran with under spec.elastic (a shrunk job grows back at a
    checkpoint, not by a restart), else on spec.workers. The spec's own when it was edited since
    so that they no longer keep its global batch (docs/sdk.md: under fsdp a user may edit workers
    and processesPerWorker of a running job, and the next attempt runs with the new ones), or so
    that elastic.minWorkers no longer allows as few."""
    if resize is not None:
        return resize.workers, resize.shape
    workers = workers_of(spec, attempt) if spec.elastic is not None else spec.workers
    shape = shape_of(attempt)
    ran = shape or BatchShape.of(spec)
    if ran.micro_batch * ran.grad_accumulation * workers * processes_per_worker(spec) != global_batch(spec):
        return spec.workers, None
    if spec.elastic is not None and workers < spec.elastic.min_workers:
        return spec.workers, None
    return workers, shape


def grows(
    spec: MixedPrecisionJobSpec, attempt: AttemptStatus, fits: int | None, status: MixedPrecisionJobStatus
) -> Resize | None:
    """A running attempt below `workers` when `fits` workers fit on the cluster now (None: not
    known): the size it grows to, its micro-batches within growth_micro_batch of the job's
    `status`, or None."""
    if spec.elastic is None or fits is None:
        return None
    micro = growth_micro_batch(spec, attempt.precision, status)
    workers, shape = workers_of(spec, attempt), _shape(spec, attempt)
    resize = decide(spec, workers=workers, shape=shape, capacity=Capacity(fits), grow_micro=micro)
    return resize if resize.verdict is Verdict.GROW else None


def room_after(
    spec: MixedPrecisionJobSpec,
    status: MixedPrecisionJobStatus,
    attempt: AttemptStatus,
    outcome: AttemptOutcome,
    fits: int | None,
) -> Resize | None:
    """The size the attempt after `attempt`, which ended as `outcome` and was not resized, starts
    at when `fits` workers fit now (`grows`; None: its own), read before the ending is recorded: the
    operator's reconcile and `mpjob run` pass it to the lifecycle's conclude as `room`, so the job
    grows at once, not at the next attempt's first checkpoint, a restart more. Not after running out
    of memory: the grown size's split, chosen before that micro-batch was known too big, may be it;
    it goes on split at its own size and grows at a checkpoint."""
    if outcome.resize is not None:
        return None
    if under_policy(classify(outcome), spec.fault_policy, outcome.report).action is Action.SMALLER_MICRO_BATCH:
        return None
    return grows(spec, attempt, fits, status)


def grows_at(spec: MixedPrecisionJobSpec, checkpoint_step: int) -> bool:
    """May a growth stop the attempt at its checkpoint of `checkpoint_step`? Not at the job's last
    step: the attempt ends Succeeded there, and a bigger one would have no step left to train."""
    return checkpoint_step < spec.training.steps


def grown(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, grow: Resize | None) -> Resize | None:
    """`grow` once the attempt has committed a checkpoint past the step where more workers began to
    fit (status.growAfterStep, set here, remembers it) and short of the job's last step, else None."""
    if grow is None or status.grow_after_step is None:
        status.grow_after_step = None if grow is None else status.step
        return None
    ckpt = status.last_checkpoint
    due = ckpt is not None and ckpt.step > status.grow_after_step and grows_at(spec, ckpt.step)
    return grow if due else None
