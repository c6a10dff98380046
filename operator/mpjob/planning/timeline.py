"""status.timeline: the loss-scale history and the precision of each step range, folded from
what the trainers said (mpjob_contract.timeline has the rule and the bounds).

Three sources, one place: an attempt's termination report (its own history, which replaces what
live readings put in for that attempt), a live reading (a point when the scale moved two octaves
or more since the attempt's last point: `kubectl get mpj -o yaml` shows a collapse while it
happens) and attempts[] (one precision span per attempt, kept after its entry is dropped).
"""

from __future__ import annotations

from collections.abc import Sequence

from mpjob.planning import history
from mpjob.planning.figures import figure
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.timeline import (
    MAX_PRECISION_SPANS,
    MAX_SCALE_POINTS,
    LossScalePoint,
    PrecisionSpan,
    PrecisionTimeline,
    far_enough,
    first_and_newest,
)


def _timeline(status: MixedPrecisionJobStatus) -> PrecisionTimeline:
    if status.timeline is None:
        status.timeline = PrecisionTimeline()
    return status.timeline


def reported(status: MixedPrecisionJobStatus, attempt: int, points: Sequence[tuple[int, float]]) -> None:
    """Attempt `attempt`'s own history (its report) in place of what live readings saw of it; a
    report with none (a rank that died before writing its own) leaves what was seen."""
    if not points:
        return
    timeline = _timeline(status)
    job = history.job_index(status, attempt)
    chain = [a for a in status.attempts if job <= a.index <= attempt and history.job_index(status, a.index) == job]
    others = [p for p in timeline.loss_scale if not job <= p.attempt <= attempt]
    before = [p for p in others if p.attempt < job]
    after = [p for p in others if p.attempt > attempt]
    own = [LossScalePoint(step=s, scale=figure(v), attempt=_owner(chain, attempt, s)) for s, v in points]
    timeline.loss_scale = first_and_newest([*before, *own, *after], MAX_SCALE_POINTS)


def _owner(chain: Sequence[AttemptStatus], attempt: int, step: int) -> int:
    """Whose a report's point is: the reporting attempt's, or in a process that went on in place
    (its `chain` of attempts, one Job), the newest of them in fp16 (the one precision with a
    loss scale) begun at or before the step."""
    scaled = [a.index for a in chain if a.precision == "fp16" and a.start_step <= step]
    return scaled[-1] if scaled else attempt


def live(status: MixedPrecisionJobStatus, attempt: int, step: int, scale: float) -> None:
    """A live reading of the running attempt's loss scale: a point when it is news."""
    timeline = _timeline(status)
    own = [p for p in timeline.loss_scale if p.attempt == attempt]
    last = own[-1] if own else None
    if last is not None and (last.step >= step or not far_enough(last.scale, scale)):
        return
    point = LossScalePoint(step=step, scale=figure(scale), attempt=attempt)
    timeline.loss_scale = first_and_newest([*timeline.loss_scale, point], MAX_SCALE_POINTS)


def spans(status: MixedPrecisionJobStatus) -> None:
    """One precision span per attempt in attempts[], updated in place; spans of attempts no
    longer in attempts[] stay (the first and the newest MAX_PRECISION_SPANS)."""
    if not status.attempts:
        return
    timeline = _timeline(status)
    known = {span.attempt: span for span in timeline.precision}
    for entry in status.attempts:
        known[entry.index] = PrecisionSpan(
            attempt=entry.index, precision=entry.precision, from_step=entry.start_step, to_step=entry.end_step
        )
    ordered = [known[i] for i in sorted(known)]
    timeline.precision = first_and_newest(ordered, MAX_PRECISION_SPANS)
