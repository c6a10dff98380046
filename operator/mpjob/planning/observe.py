"""What one live reading of a running attempt changes in the job's status: one rule for both
sources of live progress, the operator's read of rank 0's metrics endpoint
(`controller/progress.py`) and `mpjob run`'s trainer event lines (`localrun/runner.py`). Each
side only translates its source into a `Reading`; `observe` decides.

The rules, written once here:
- live figures are the current attempt's own: a reading taken of another attempt changes nothing;
- a figure is a real reading only once the attempt logged a step past where it began (before,
  the trainer's gauges hold placeholders: a negative value, a zero scale or throughput, a start
  step of -1 while it has not decided where it starts), so the status never claims progress not
  seen and its step never goes below where the attempt began; a loss scale only in fp16;
- every step a reading names is held to [0, training.steps] (`reported.within`: the report's rule);
- figures are kept as `planning/figures.py` rounds them;
- the trainer's own start step replaces the planned one, with an Event that says so, once per
  attempt (`startStepReported`): a start step that flaps later changes nothing;
- an `auto` attempt takes the precision it measured (`planning/reported.py`), and the job the
  condition AmpSlowerThanFp32 when that was fp32 though AMP stayed finite (`planning/slower.py`);
- a restarted attempt's recoverySeconds is the trainer's, written once;
- the attempt's progressTime is when a reading first showed it and then each one that showed its
  step move (`moved`): runPolicy.progressDeadlineSeconds counts from it (`cutoff.stalled`);
- lastCheckpoint only moves forward (or gains the sha256 of the step it holds without one);
- status.skipped takes what the trainer's quarantine adds, each newly listed step with its
  Event (`planning/skipped.py`, the rule the attempt's end uses too);
- given checkpoint.everySteps, the condition CheckpointsFailing follows the step's distance from
  lastCheckpoint, each flip with its Event (`planning/lapse.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mpjob.planning import lapse, reported, skipped, slower, timeline
from mpjob.planning.figures import FIGURES as ROUNDED
from mpjob.planning.figures import figure
from mpjob.planning.plan import Event
from mpjob.planning.status import ConditionReason
from mpjob_contract.api import AttemptStatus, CheckpointStatus, MixedPrecisionJobStatus, Precision
from mpjob_contract.skipping import Skipped, SkippedStep

#: The live figures a reading may carry, by their status field names.
LIVE = ("step", "loss", "loss_scale", "overflow_steps", "samples_per_second", "eval_loss", "eval_loss_delta")
#: Figures for which zero is the trainer's placeholder, never a reading.
_ZERO_IS_NONE = ("loss_scale", "samples_per_second")


@dataclass(frozen=True, slots=True)
class CheckpointReading:
    """A good checkpoint the trainer names: its sha256 ("" when the source does not say), the
    precision it was written in (None: the attempt's) and its path ("" from a scrape: the next
    attempt's resumeFrom comes only from a termination report)."""

    step: int
    sha256: str = ""
    precision: str | None = None
    path: str = ""


@dataclass(frozen=True, slots=True)
class Reading:
    """What a source saw of a running attempt, untouched; None: not in this reading."""

    #: Whose reading this is (None: the source reads only the running attempt).
    attempt: int | None = None
    step: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    overflow_steps: int | None = None
    samples_per_second: float | None = None
    eval_loss: float | None = None
    eval_loss_delta: float | None = None
    #: Where the trainer really began (negative: not decided yet).
    start_step: int | None = None
    #: A restarted attempt's seconds from its predecessor's end to resumed (negative: not yet).
    recovery_seconds: float | None = None
    checkpoint: CheckpointReading | None = None
    #: What an `auto` attempt measured: the precision it chose and the step times behind it.
    measured_precision: Precision | None = None
    measured_step_seconds: dict[str, float | None] | None = None
    #: The run's quarantine as the trainer holds it (cumulative, bounded).
    skipped: Skipped | None = None


@dataclass(frozen=True, slots=True)
class Observation:
    """The status with the reading in it (a copy), the start-step correction's Event
    (reason, message) when the reading corrects the planned start step, and the skipped steps
    it newly lists (one Event each: `skipped.announcement`)."""

    status: MixedPrecisionJobStatus
    news: Event | None = None
    skips: tuple[SkippedStep, ...] = ()
    #: The CheckpointsFailing condition's flip, if it flipped.
    lapse: Event | None = None
    #: The AmpSlowerThanFp32 condition's Warning, the first time a measurement shows it.
    slower: Event | None = None

    def told(self) -> list[Event]:
        """The Events this reading earns, in order."""
        told = [event for event in (self.news, self.slower, self.lapse) if event is not None]
        return told + [skipped.announcement(step) for step in self.skips]

    def lines(self) -> list[str]:
        """What `mpjob run` prints of them: the start-step correction and the conditions' news
        (its step lines show the skips)."""
        said = [event for event in (self.news, self.slower, self.lapse) if event is not None]
        return [f"warning: {e.message}" if e.type == "Warning" else e.message for e in said]


def real(reading: Reading, *, precision: str | None) -> Reading:
    """`reading` without its placeholders: figures only past the attempt's start, a loss scale
    only in fp16, no start step before the trainer decided it."""
    start = reading.start_step if reading.start_step is not None else 0
    kept = reading if start >= 0 else replace(reading, start_step=None)
    if kept.recovery_seconds is not None and kept.recovery_seconds < 0:
        kept = replace(kept, recovery_seconds=None)
    step = reading.step
    if start < 0 or step is None or step < 0 or step <= start:
        return replace(kept, **{name: None for name in LIVE})
    dropped: dict[str, Any] = {}
    for name in LIVE:
        value = getattr(reading, name)
        if value is not None and (value < 0 or (name in _ZERO_IS_NONE and value == 0)):
            dropped[name] = None
    if precision != "fp16":
        dropped["loss_scale"] = None
    return replace(kept, **dropped)


def bounded(reading: Reading, status: MixedPrecisionJobStatus) -> Reading:
    """`reading` (placeholders gone: `real`) with every step it names within the job's range."""
    ck = reading.checkpoint
    return replace(
        reading,
        step=reported.within(reading.step, status) if reading.step is not None else None,
        start_step=reported.within(reading.start_step, status) if reading.start_step is not None else None,
        checkpoint=replace(ck, step=reported.within(ck.step, status)) if ck is not None else None,
    )


def observe(
    status: MixedPrecisionJobStatus, reading: Reading, *, at: str | None = None, every_steps: int | None = None
) -> Observation:
    """What `reading`, taken at `at` (a status timestamp; None: its progressTime is not kept),
    changes in `status` (which is left as it is); with checkpoint.everySteps, its
    CheckpointsFailing condition too."""
    new = status.model_copy(deep=True)
    current = new.attempts[-1] if new.attempts else None
    if reading.attempt is not None and (current is None or current.index != reading.attempt):
        return Observation(new)  # another attempt's figures are not this one's
    chosen, seconds = reading.measured_precision, reading.measured_step_seconds
    measurer = reported.measuring(new, current.index) if current is not None else None
    measuring = None
    if measurer is not None and chosen and seconds is not None and measurer.measured_step_seconds is None:
        reported.measured(new, measurer, chosen, seconds)  # once, to the attempt that measured
        measuring = slower.update(new, chosen, seconds, at=at)
    seen = bounded(real(reading, precision=current.precision if current is not None else new.precision), new)
    for name in LIVE:
        value = getattr(seen, name)
        if value is not None:
            setattr(new, name, figure(value) if name in ROUNDED else value)
    if current is not None and at is not None and moved(status.step, current.progress_time, new.step):
        current.progress_time = at
    if current is not None and seen.loss_scale is not None and seen.step is not None:
        timeline.live(new, current.index, seen.step, seen.loss_scale)
    news = None
    if current is not None and (start := seen.start_step) is not None and _corrects(current, start):
        news = start_news(current, start)
        current.start_step = start  # the trainer decides where it resumes: record that
        current.start_step_reported = True
    if current is not None and seen.recovery_seconds is not None and current.recovery_seconds is None:
        current.recovery_seconds = figure(seen.recovery_seconds)  # the trainer's, once: as in place
    if seen.checkpoint is not None and _newer(new.last_checkpoint, seen.checkpoint):
        ck = seen.checkpoint
        precision = ck.precision or new.precision or ""
        new.last_checkpoint = CheckpointStatus(step=ck.step, sha256=ck.sha256, precision=precision, path=ck.path)
    flip = lapse.update(new, every_steps, at) if every_steps is not None and current is not None else None
    return Observation(new, news, tuple(skipped.record(new, reading.skipped)), flip, measuring)


def moved(before: int | None, since: object | None, step: int | None) -> bool:
    """Whether a reading that leaves the attempt at `step` is progress, for a watcher that saw it
    at `before` last, `since` then (None: nothing seen yet): the first sighting, and any step
    other than the last one. runPolicy.progressDeadlineSeconds counts from the last progress, so
    a trainer still starting (its step a placeholder) is counted from its first sighting."""
    return since is None or step != before


def _corrects(current: AttemptStatus, start: int) -> bool:
    """Whether a reading's start step replaces `current`'s: a different one, and the first."""
    return start != current.start_step and not current.start_step_reported


def _newer(held: CheckpointStatus | None, named: CheckpointReading) -> bool:
    """Whether `named` is news: a later step, or the held step's sha256 the status lacks."""
    if held is None or held.step < named.step:
        return True
    return held.step == named.step and bool(named.sha256) and not held.sha256


def start_news(current: AttemptStatus, real_start: int) -> Event:
    """The Event that corrects `current`'s planned start step with the
    one its trainer reports."""
    planned = f"planned: checkpoint step {current.start_step}" if current.start_step else "planned: a fresh start"
    if real_start == 0:
        message = f"attempt {current.index} ({current.precision}) found no checkpoint of its own to resume from"
        return Event("Normal", ConditionReason.STARTED_FRESH, f"{message} and started at step 0 ({planned})")
    message = f"attempt {current.index} ({current.precision}) resumed from checkpoint step {real_start}"
    return Event("Normal", ConditionReason.RESUMED, f"{message} ({planned})")


def changes(before: MixedPrecisionJobStatus, after: MixedPrecisionJobStatus) -> dict[str, Any]:
    """The status fields (camelCase) `after` holds differently from `before`: a merge patch of
    what a reading changed (a reading never removes a field)."""
    stored = before.to_api()
    return {k: v for k, v in after.to_api().items() if stored.get(k) != v}
