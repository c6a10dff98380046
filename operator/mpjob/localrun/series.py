"""The recorded training series of a local run: what the plot and the summary are drawn from.

Points come from the trainer's step and eval lines (`mpjob_contract.events`); attempts from the planner. The series is
saved beside report.json so that a resumed `mpjob run` keeps drawing one continuous story.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from mpjob.localrun.files import write_replacing
from mpjob.localrun.paths import START_OVER, Unreadable, UnusableOut, first_problem, read_bounded
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobStatus

#: The most of a series.json read back: a point is about 200 bytes, so a run that logged a
#: million steps fits; a bigger file is no run's series (and would not be held to draw it).
MAX_SERIES_BYTES = 256 << 20


@dataclass
class Point:
    attempt: int
    precision: str
    step: int
    loss: float | None
    loss_scale: float | None
    grad_norm: float | None
    overflow_steps: int
    samples_per_second: float | None


@dataclass
class EvalPoint:
    """One quality-gate evaluation: eval loss in the attempt's precision and in fp32."""

    attempt: int
    step: int
    loss: float | None
    loss_fp32: float | None
    delta: float | None


@dataclass
class SkipMark:
    """A step the trainer rolled back from and skipped (bad data or a loss spike)."""

    attempt: int
    step: int
    cause: str


@dataclass
class Span:
    """One attempt's stretch of steps, shaded by precision in the plot."""

    attempt: int
    precision: str
    start_step: int
    end_step: int | None = None
    reason: str | None = None


@dataclass
class RunSeries:
    points: list[Point] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    evals: list[EvalPoint] = field(default_factory=list)
    skips: list[SkipMark] = field(default_factory=list)

    def begin_attempt(self, attempt: int, precision: str, start_step: int) -> None:
        self.spans = [s for s in self.spans if s.attempt != attempt]
        self.points = [p for p in self.points if p.attempt != attempt]
        self.evals = [e for e in self.evals if e.attempt != attempt]
        self.skips = [s for s in self.skips if s.attempt != attempt]
        self.spans.append(Span(attempt, precision, start_step))

    def end_attempt(self, attempt: int, end_step: int | None, reason: str | None) -> None:
        for span in self.spans:
            if span.attempt == attempt:
                span.end_step = end_step
                span.reason = reason

    def ingest(self, attempt: int, precision: str, line: events.TrainerEvent) -> Point | None:
        """Record a trainer step line; other events are ignored. Returns the new point. A step its
        attempt logged before (run again after a rollback in place: bad data skipped, a spike)
        replaces what the attempt logged from that step on: each attempt's line is the state it
        trained on, each step once (another attempt's points at the step stay its own)."""
        if not isinstance(line, events.Step):
            return None
        last = next((p for p in reversed(self.points) if p.attempt == attempt), None)  # the newest: at the end
        if last is not None and last.step >= line.step:
            self.points = [p for p in self.points if p.attempt != attempt or p.step < line.step]
        point = Point(
            attempt=attempt,
            precision=line.precision or precision,
            step=line.step,
            loss=line.loss,
            loss_scale=line.loss_scale,
            grad_norm=line.grad_norm,
            overflow_steps=line.overflow_steps,
            samples_per_second=line.samples_per_second,
        )
        self.points.append(point)
        return point

    def measured(self, attempt: int, precision: str) -> None:
        """An `auto` attempt chose `precision`: its span is drawn in it."""
        for span in self.spans:
            if span.attempt == attempt and precision:
                span.precision = precision

    def ingest_eval(self, attempt: int, line: events.TrainerEvent) -> EvalPoint | None:
        """Record a trainer eval line (the quality gate); other events are ignored."""
        if not isinstance(line, events.Eval):
            return None
        point = EvalPoint(attempt, line.step, line.loss, line.loss_fp32, line.delta)
        self.evals.append(point)
        return point

    def ingest_skip(self, attempt: int, line: events.TrainerEvent) -> list[SkipMark]:
        """Record a trainer dataSkipped line; other events are ignored."""
        if not isinstance(line, events.DataSkipped):
            return []
        marks = [SkipMark(attempt, step, line.cause) for step in line.steps]
        self.skips.extend(marks)
        return marks

    def overflow_marks(self) -> list[Point]:
        """Points at which the attempt's overflow-skipped step count went up."""
        marks: list[Point] = []
        last: dict[int, int] = {}
        for p in self.points:
            if p.overflow_steps > last.get(p.attempt, 0):
                marks.append(p)
            last[p.attempt] = p.overflow_steps
        return marks

    def save(self, path: Path) -> None:
        data = {
            "points": [asdict(p) for p in self.points],
            "spans": [asdict(s) for s in self.spans],
            "evals": [asdict(e) for e in self.evals],
            "skips": [asdict(s) for s in self.skips],
        }
        write_replacing(path, json.dumps(events.wire(data)))  # a nan loss as "nan": JSON has no NaN

    @classmethod
    def load(cls, path: Path) -> RunSeries:
        """What an earlier run of the folder left (UnusableOut: a file it cannot read)."""
        if not path.exists() and not path.is_symlink():
            return cls()
        try:
            return read_series(path)
        except Unreadable as exc:
            raise UnusableOut(f"{path.parent}: series.json is not a run's series ({exc}): {START_OVER}") from exc


#: The saved series as checked before it is used: each list of the dataclass it holds, typed.
_SAVED = TypeAdapter(dict[str, list[Any]])
_KINDS: dict[str, TypeAdapter[Any]] = {
    "points": TypeAdapter(list[Point]),
    "spans": TypeAdapter(list[Span]),
    "evals": TypeAdapter(list[EvalPoint]),
    "skips": TypeAdapter(list[SkipMark]),
}


def read_series(path: Path) -> RunSeries:
    """The series a run saved at `path`, read as untrusted (what ran in the trainers can put
    anything in the folder): a regular file (not a link, nor a FIFO that would hang the read) of
    at most MAX_SERIES_BYTES, each figure of the type the run writes; Unreadable says why not."""
    data = read_bounded(path, MAX_SERIES_BYTES)
    try:
        saved = _SAVED.validate_json(data)
    except ValidationError as exc:
        raise Unreadable(first_problem(exc)) from exc
    return RunSeries(**{kind: _checked(kind, saved.get(kind, []), adapter) for kind, adapter in _KINDS.items()})


def _checked(kind: str, saved: list[Any], adapter: TypeAdapter[Any]) -> list[Any]:
    """One list of a saved series, each entry checked as its dataclass; Unreadable names the
    first entry that is not one from the series' top (points.3.step)."""
    try:
        return adapter.validate_python([_figures(entry) for entry in saved])  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise Unreadable(f"{kind}.{first_problem(exc)}") from exc


def _figures(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved point with its non-finite figures, written by name ("nan", "inf"), numbers again."""
    if not isinstance(saved, dict):
        return saved  # refused by its dataclass's check
    return {k: float(v) if isinstance(v, str) and v in ("nan", "inf", "-inf") else v for k, v in saved.items()}


def series_of_status(status: MixedPrecisionJobStatus) -> RunSeries:
    """What a job's status alone says of its run (`mpjob status`): each attempt's span and its
    last loss and loss scale, and the skipped steps; the loss-scale history is the timeline's."""
    series = RunSeries()
    for a in status.attempts:
        series.begin_attempt(a.index, a.precision, a.start_step)
        series.end_attempt(a.index, a.end_step, a.reason)
        if a.end_step is not None and a.loss is not None:
            series.points.append(Point(a.index, a.precision, a.end_step, a.loss, a.loss_scale, None, 0, None))
    last = status.attempts[-1].index if status.attempts else 0
    for skipped in status.skipped.steps if status.skipped else []:
        series.skips.append(SkipMark(last, skipped.step, skipped.cause))
    return series
