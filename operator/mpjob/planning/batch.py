"""The batch shape of an attempt: samples per micro-batch and micro-batches per optimizer step.

An attempt's shape may differ from spec.training's, but never its samples per optimizer step
over all processes (the global batch): a split divides the micro-batch by its smallest prime
factor and multiplies the accumulation by the same, and a resized world takes global / world
samples per process, so the samples of each step, and their order, stay the same
(mpjob_trainer.data.StepSampler addresses the data by samples).

One rule says how large an attempt's micro-batch may be (`largest_micro_batch`): the planner's
re-promotion, its fallback (`held`) and a grown elastic attempt all take it, so none undoes a
split the job needs. Running out of device memory holds the precision it happened in and every
wider one (`too_big`), by ACTIVATION_BYTES.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mpjob.planning.history import ran_out_of_memory
from mpjob_contract.api import AttemptCounts, AttemptStatus, MixedPrecisionJobSpec, processes_per_worker

#: Bytes an activation takes in each precision: a fallback to a wider one needs more memory.
ACTIVATION_BYTES = {"fp8": 2, "fp16": 2, "bf16": 2, "fp32": 4}  # fp8: its activations are bf16


@dataclass(frozen=True)
class BatchShape:
    micro_batch: int
    grad_accumulation: int

    @classmethod
    def of(cls, spec: MixedPrecisionJobSpec) -> BatchShape:
        return cls(spec.training.batch_size, spec.training.grad_accumulation)

    def split(self) -> BatchShape | None:
        """A smaller micro-batch with the same samples per step; None at one sample."""
        if self.micro_batch < 2:
            return None
        factor = next(f for f in range(2, self.micro_batch + 1) if self.micro_batch % f == 0)
        return BatchShape(self.micro_batch // factor, self.grad_accumulation * factor)


def wider(precision: str, than: str) -> bool:
    """Does `precision` keep activations in more bytes than `than` (fp32 than fp16, bf16 or fp8)?"""
    return ACTIVATION_BYTES.get(precision, 4) > ACTIVATION_BYTES.get(than, 4)


def global_batch(spec: MixedPrecisionJobSpec) -> int:
    """Samples per optimizer step over every process, at the spec's full size."""
    tr = spec.training
    return spec.workers * processes_per_worker(spec) * tr.batch_size * tr.grad_accumulation


def shape_for(spec: MixedPrecisionJobSpec, workers: int, max_micro_batch: int) -> BatchShape | None:
    """The batch shape that keeps the global batch on `workers` pods, its micro-batch the largest
    divisor of the per-process samples up to `max_micro_batch`; None when the world does not
    divide the global batch."""
    per_process, rest = divmod(global_batch(spec), workers * processes_per_worker(spec))
    if rest or per_process == 0:
        return None
    micro = max(d for d in range(1, min(max_micro_batch, per_process) + 1) if per_process % d == 0)
    return BatchShape(micro, per_process // micro)


def largest_micro_batch(
    spec: MixedPrecisionJobSpec, precision: str, attempts: Sequence[AttemptStatus], counts: AttemptCounts | None
) -> int:
    """The largest micro-batch an attempt in `precision` may take, given the job's `attempts` and
    `counts` (an entry may be gone from attempts[]): training.batchSize, split as the fallback into
    a wider precision than one the job's attempts trained in splits it (precision.fallbackKeepsBatch),
    and below the micro-batch an attempt of the job ran out of device memory in (`too_big`):
    going back up (a re-promotion, a grown world) never undoes a split that keeps the job within
    memory."""
    largest = BatchShape.of(spec)
    if spec.precision.fallback_keeps_batch and any(wider(precision, a.precision) for a in attempts):
        largest = largest.split() or largest
    limit = too_big(precision, attempts, counts)
    return max(1, min(largest.micro_batch, limit - 1 if limit is not None else largest.micro_batch))


def too_big(precision: str, attempts: Sequence[AttemptStatus], counts: AttemptCounts | None) -> int | None:
    """The smallest micro-batch that ran out of device memory in `precision` or a narrower one
    (fewer bytes per activation: an attempt in bf16 ran out at 8, so fp32 would too); one that
    ran out in a wider precision says nothing of a narrower one (fp32 at 8 leaves bf16 its own).
    An unknown precision (`auto` before it measured) and a status written before the precision
    was kept (counts.outOfMemoryMicroBatch) hold every precision. None: nothing holds it."""
    ran_out = ran_out_of_memory(attempts, counts)
    held = [m for was, m in ran_out.items() if was not in ACTIVATION_BYTES or not wider(was, precision)]
    if counts is not None and counts.out_of_memory_micro_batch is not None:
        held.append(counts.out_of_memory_micro_batch)
    return min(held, default=None)


def largest_shape(
    spec: MixedPrecisionJobSpec,
    precision: str,
    workers: int,
    attempts: Sequence[AttemptStatus],
    counts: AttemptCounts | None,
) -> BatchShape | None:
    """The shape of an attempt in `precision` on `workers` pods with the largest micro-batch it may
    take (`largest_micro_batch`), the global batch kept; None when the world does not divide it."""
    return shape_for(spec, workers, largest_micro_batch(spec, precision, attempts, counts))


def held(
    spec: MixedPrecisionJobSpec,
    precision: str,
    shape: BatchShape,
    workers: int,
    attempts: Sequence[AttemptStatus],
    counts: AttemptCounts | None,
) -> BatchShape:
    """`shape` for an attempt in `precision`, or the largest it may take (`largest_shape`) when
    `shape`'s micro-batch is larger: a fallback into fp32 never goes back to one fp32 ran out in."""
    if shape.micro_batch <= largest_micro_batch(spec, precision, attempts, counts):
        return shape
    return largest_shape(spec, precision, workers, attempts, counts) or shape
