"""Where the run went: the loss-scale history and the precision of each step range.

The trainer keeps the loss-scale history of its attempt by one rule, `ScaleHistory`: a point at
every checkpoint and at every change of OCTAVES or more (a factor of 4) since the last point
kept, the first and the newest kept when there are more than its bound. It hands them over in
its termination report (`TerminationReport.loss_scales`, [step, scale] pairs); the operator and
`mpjob run` fold each attempt's points into `status.timeline` (at most MAX_SCALE_POINTS) and
the precision spans from attempts[]. `mpjob run`'s plot draws the same status.timeline.

No torch, no pydantic beyond the models: the trainer, the operator and the launcher import it.
"""

from __future__ import annotations

import math
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

T = TypeVar("T")

#: Loss-scale points status.timeline keeps, over all attempts (the first and the newest).
MAX_SCALE_POINTS = 64
#: Points one termination report carries: [step, scale] pairs take about 20 bytes each, and the
#: whole report must stay within MAX_REPORT_BYTES beside its checkpoint, counters and message.
MAX_REPORT_SCALE_POINTS = 48
#: Precision spans status.timeline keeps (one per attempt; the first and the newest).
MAX_PRECISION_SPANS = 64
#: A change of the loss scale this many octaves (powers of two) or more is a point of its own.
OCTAVES = 2.0


def far_enough(last: float | None, scale: float) -> bool:
    """Whether `scale` moved OCTAVES or more from `last` (None: nothing kept yet: it is news)."""
    if last is None or last <= 0 or scale <= 0:
        return True
    return abs(math.log2(scale / last)) >= OCTAVES


def first_and_newest(items: list[T], limit: int) -> list[T]:
    """`items` within `limit`: the first (where the run began) and the newest."""
    if len(items) <= limit:
        return items
    if limit <= 1:
        return items[:limit]
    return items[:1] + items[len(items) - (limit - 1) :]


class ScaleHistory:
    """One attempt's loss-scale points, kept by the rule above (the trainer's, at intervals)."""

    def __init__(self, limit: int = MAX_REPORT_SCALE_POINTS) -> None:
        self.limit = limit
        self.points: list[tuple[int, float]] = []

    def seen(self, step: int, scale: float | None, *, checkpoint: bool = False) -> None:
        """The scale read at `step` (None or not finite and positive: no scale, nothing kept)."""
        if scale is None or not math.isfinite(scale) or scale <= 0:
            return
        last = self.points[-1] if self.points else None
        if last is not None and last[0] == step:
            return
        if checkpoint or far_enough(last[1] if last else None, scale):
            self.points = first_and_newest([*self.points, (step, scale)], self.limit)


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class LossScalePoint(_Model):
    step: int = Field(description="Optimizer step the scale was read at (the attempt's own count).")
    scale: float = Field(description="fp16 GradScaler loss scale at that step.")
    attempt: int = Field(description="The attempt that read it (steps repeat after a rollback).")


class PrecisionSpan(_Model):
    attempt: int
    precision: str = Field(description="The precision the attempt trained in.")
    from_step: int = Field(description="The step it began at (the checkpoint it resumed from).")
    to_step: int | None = Field(None, description="The step it ended at (unset while it runs).")


class PrecisionTimeline(_Model):
    """The loss-scale history and the precision of each step range, over every attempt."""

    loss_scale: list[LossScalePoint] = Field(
        default_factory=list,
        description=f"A point per checkpoint and per change of {OCTAVES:g} octaves or more, fp16 attempts "
        f"only; at most {MAX_SCALE_POINTS} (the first and the newest).",
    )
    precision: list[PrecisionSpan] = Field(
        default_factory=list, description=f"One span per attempt, at most {MAX_PRECISION_SPANS} (first and newest)."
    )


def readable_points(value: object, limit: int = MAX_REPORT_SCALE_POINTS) -> list[tuple[int, float]]:
    """The [step, scale] pairs of a report, read tolerantly: a pair that is not a step (an integer
    in [0, 2^53)) and a finite positive scale is dropped, not a reason to distrust the report;
    at most `limit` (the first and the newest)."""
    if not isinstance(value, list | tuple):
        return []
    kept: list[tuple[int, float]] = []
    for item in value:
        if not (isinstance(item, list | tuple) and len(item) == 2):
            continue
        step, scale = item
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 2**53:
            continue
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale) or scale <= 0:
            continue
        kept.append((step, float(scale)))
    return first_and_newest(kept, limit)
