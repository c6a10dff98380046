"""What an attempt's termination report tells the status: the last good checkpoint, where the
trainer stopped and began, its final counters, and what an `auto` attempt measured.

The report reaching here was validated (mpjob_contract.report): its precision is one the API
knows and its numbers are bounded, so nothing it says can make the status unwritable. Its steps
are still the tenant's word: `within` holds each one to the job's own range, [0, training.steps],
as `planning/observe.py` does for a live reading, so no step past the end inflates an attempt's
endStep, samples or wasted steps.
"""

from __future__ import annotations

from mpjob.planning import history, timeline
from mpjob.planning.figures import figure, round_figures
from mpjob_contract.api import AttemptStatus, CheckpointStatus, MixedPrecisionJobStatus, Precision, is_auto, settled
from mpjob_contract.report import TerminationReport


def within(step: int, status: MixedPrecisionJobStatus) -> int:
    """A step a trainer names, held to [0, status.totalSteps] (the largest training.steps the job
    has had, which every reconcile and `mpjob run` write into the status before anything reads a
    trainer: an attempt trains to the steps it was launched with, an edit lowering them aside)."""
    top = status.total_steps if status.total_steps is not None else step
    return min(max(step, 0), top)


def bounded(report: TerminationReport, status: MixedPrecisionJobStatus) -> TerminationReport:
    """`report` with every step it names `within` the job's range."""
    ref = report.last_good_checkpoint
    start = report.start_step
    return report.model_copy(
        update={
            "step": within(report.step, status),
            "start_step": within(start, status) if start is not None else None,
            "last_good_checkpoint": ref.model_copy(update={"step": within(ref.step, status)}) if ref else None,
        }
    )


def without_progress(status: MixedPrecisionJobStatus, index: int, report: TerminationReport) -> bool:
    """Whether `report` carries no progress: one the launcher made for ranks that left no report
    of their own (no start step, step 0 no further than where the attempt began; attempt 0's
    too, whose ranks may have trained before they were killed). The job's step stays where it
    stood (`ended_at`)."""
    began = next((a.start_step for a in status.attempts if a.index == index), 0)
    return report.start_step is None and report.step <= began


def ended_at(status: MixedPrecisionJobStatus, index: int, report: TerminationReport) -> int:
    """The attempt's endStep by a report without progress: where a live reading last saw it (the
    job's step, once a reading showed the attempt), else the report's (below a resumed attempt's
    start: 'unknown', planning.repeat)."""
    seen = any(a.index == index and a.progress_time is not None for a in status.attempts)
    return status.step if seen else report.step


def seen_at(status: MixedPrecisionJobStatus, index: int) -> int:
    """Where attempt `index` stands as the operator has seen it, for an ending it decides itself
    (runPolicy.suspend, runPolicy.activeDeadlineSeconds): the job's step once a live reading
    showed the attempt, else where it began (a Job its queue never admitted, one not made yet:
    the job's step is the attempt before it's). Its pods' report, once they stop, says more
    (`cutoff.heard`)."""
    entry = next((a for a in status.attempts if a.index == index), None)
    if entry is None or entry.progress_time is not None:
        return status.step
    return entry.start_step


def record_report(status: MixedPrecisionJobStatus, index: int, report: TerminationReport | None) -> int:
    """What the trainer's report tells: the last good checkpoint, where it stopped and began."""
    if report is None:
        return status.step
    report = bounded(report, status)
    if report.last_good_checkpoint is not None:
        ref = report.last_good_checkpoint
        status.last_checkpoint = CheckpointStatus(
            step=ref.step, sha256=ref.sha256, precision=ref.precision, path=ref.path
        )
    unseen = without_progress(status, index, report)
    if not unseen:  # else the launcher's zeros: the live reading stands
        status.step = report.step
        if newest(status, index):
            counts(status, report)
    for attempt in status.attempts:
        if attempt.index == index and report.start_step is not None and not attempt.start_step_reported:
            attempt.start_step = report.start_step  # where it began, not the plan (a read may have said so)
        if attempt.index == index and attempt.recovery_seconds is None and report.recovery_seconds is not None:
            attempt.recovery_seconds = figure(report.recovery_seconds)  # no read caught the trainer's figure
    if report.measurement is not None and (measurer := measuring(status, index)) is not None:
        measured(status, measurer, report.measurement.chosen, report.measurement.step_seconds)
    timeline.reported(status, index, report.loss_scales)
    round_figures(status)
    return ended_at(status, index, report) if unseen else report.step


def newest(status: MixedPrecisionJobStatus, index: int) -> bool:
    """Whether attempt `index` is the newest begun. An earlier one's report (`cutoff.heard`, read
    while the attempt after it waits for its Job, by every reconcile until then) tells no live
    figures: they are the newest attempt's own, none until its first reading (`begin_attempt`)."""
    return not status.attempts or status.attempts[-1].index <= index


def counts(status: MixedPrecisionJobStatus, report: TerminationReport) -> None:
    """The trainer's own final counts (a live reading may never have been taken); a loss scale
    exists only in fp16 (0 would read as a collapsed scale). A figure the report lacks leaves the
    last live reading as it is."""
    status.overflow_steps = report.counters.overflow_steps
    if report.counters.loss is not None:
        status.loss = report.counters.loss
    if report.precision != "fp16":
        status.loss_scale = None
    elif report.counters.loss_scale:
        status.loss_scale = report.counters.loss_scale


def measuring(status: MixedPrecisionJobStatus, index: int) -> AttemptStatus | None:
    """The attempt that measured what attempt `index`'s trainer says it measured: the attempt its
    Job began with (`history.job_index`): an `auto` attempt changed in place measured once, at
    its start, and its processes go on naming that measurement in the attempts after it."""
    first = history.job_index(status, index)
    return next((a for a in status.attempts if a.index == first), None)


def measured(
    status: MixedPrecisionJobStatus, attempt: AttemptStatus, chosen: Precision, seconds: dict[str, float | None]
) -> None:
    """An `auto` attempt measured its node: the precision it chose and the step times behind it."""
    attempt.measured_step_seconds = dict(seconds)
    relabelled = settled(attempt.precision, chosen)
    if relabelled != attempt.precision:
        attempt.precision = relabelled
        if status.attempts and status.attempts[-1] is attempt:
            status.precision = relabelled


def trained_in(status: MixedPrecisionJobStatus, index: int, precision: str) -> None:
    """Attempt `index`'s entry, still `auto` as it ends, in the `precision` its report says it
    trained in: a loop that registers no step (the HF adapter) trains in its device's default
    and reports no measurement (`measured` never runs). Left `auto`, its fallback read as a blind
    retry (`backoff`: a wait before it) and its span named no precision. A report naming none
    (`settled`: still `auto`) leaves it."""
    entry = next((a for a in status.attempts if a.index == index), None)
    if entry is not None and is_auto(entry.precision) and not is_auto(precision):
        entry.precision = precision  # type: ignore[assignment]  # not auto: a Precision
        if status.attempts[-1] is entry:
            status.precision = precision  # type: ignore[assignment]


def step_times(seconds: dict[str, float | None]) -> str:
    """'bf16 187.6 ms, fp32 24.4 ms': measured step times, for messages."""
    return ", ".join(f"{p} {s * 1000:.1f} ms" if s is not None else f"{p} non-finite" for p, s in seconds.items())
