"""How a local run shows itself: a rich live bar on a terminal, plain lines otherwise,
JSON lines with --json (one object per event, for scripts)."""

from __future__ import annotations

import sys
import threading
from typing import Any, Literal, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from mpjob.localrun.jsonlines import json_line
from mpjob.localrun.series import Point
from mpjob.pipes import to_nowhere
from mpjob.planning.lifecycle import NO_CHECKPOINT
from mpjob_contract.codes import Reason

Mode = Literal["rich", "plain", "json"]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


#: One line at a time: a stop's line comes from a thread of its own (`signal_relay`), and print
#: writes the text and its newline apart, so two threads' lines could run into one another.
#: Reentrant: a signal handler that printed (none may) would fail loudly in the stream, not hang here.
_LINE = threading.RLock()


def _line(text: str, stream: Any) -> None:
    """One line on `stream`; once its reader is gone (`mpjob run job.yaml | head`), the lines go
    nowhere and the run goes on: report.json keeps its record, a traceback would not."""
    try:
        with _LINE:
            print(text, file=stream, flush=True)
    except BrokenPipeError:
        to_nowhere(stream)


class ProgressView(Protocol):
    def attempt_started(self, attempt: int, precision: str, start_step: int, resumed: str | None) -> None: ...
    def step(self, point: Point) -> None: ...
    def attempt_ended(self, attempt: int, precision: str, reason: str, message: str) -> None: ...
    def fallback(self, from_precision: str, to_precision: str, step: int, reason: str) -> None: ...
    def info(self, text: str, **fields: Any) -> None: ...
    def close(self) -> None: ...


def _change(reason: str) -> str:
    """What a change of precision is called: back up after clean steps, or down after a fault."""
    return "precision re-promotion" if reason == Reason.REPROMOTE else "precision fallback"


def change_line(from_precision: str, to_precision: str, step: int, reason: str) -> str:
    """'precision fallback: fp16 -> bf16 (NumericFault), resuming from checkpoint step 100': `step`
    is where the next attempt resumes (the fault came later: the ended attempt's line says where),
    in the operator's words for it (planning.lifecycle)."""
    where = f"resuming from checkpoint step {step}" if step else NO_CHECKPOINT
    return f"{_change(reason)}: {from_precision} -> {to_precision} ({reason}), {where}"


def started_line(attempt: int, precision: str, start_step: int, resumed: str | None) -> str:
    """'attempt 1: bf16, start step 40, resuming from step 40 in place'."""
    resuming = f", resuming from {resumed}" if resumed else ""
    return f"attempt {attempt}: {precision}, start step {start_step}{resuming}"


class RichView:
    """Live bar: step/total, loss, loss scale, precision, attempt, samples/s and ETA."""

    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]{task.fields[precision]}[/] a{task.fields[attempt]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("scale {task.fields[scale]}"),
            TextColumn("{task.fields[sps]} samples/s"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(
            "train", total=total_steps, precision="-", attempt=0, loss="-", scale="-", sps="-"
        )
        self.progress.start()

    def _say(self, text: str | Text, *, highlight: bool = True) -> None:
        """A line as written, never read as rich markup: a trainer's message quotes brackets
        (torch.distributed's `[rank0]:`, a path) that markup would drop, or end the run on."""
        self.console.print(text, markup=False, highlight=highlight)

    def attempt_started(self, attempt: int, precision: str, start_step: int, resumed: str | None) -> None:
        self.progress.reset(self.task, completed=start_step)
        self.progress.update(self.task, precision=precision, attempt=attempt)
        self._say(started_line(attempt, precision, start_step, resumed), highlight=False)

    def step(self, point: Point) -> None:
        self.progress.update(
            self.task,
            completed=point.step,
            loss=_fmt(point.loss, ".4f"),
            scale=_fmt(point.loss_scale, ".0f"),
            sps=_fmt(point.samples_per_second, ".1f"),
        )

    def attempt_ended(self, attempt: int, precision: str, reason: str, message: str) -> None:
        self._say(f"attempt {attempt} ({precision}) ended: {reason}" + (f": {message}" if message else ""))

    def fallback(self, from_precision: str, to_precision: str, step: int, reason: str) -> None:
        line = change_line(from_precision, to_precision, step, reason)
        self._say(Text.assemble((_change(reason), "bold yellow"), line.removeprefix(_change(reason))), highlight=False)

    def info(self, text: str, **fields: Any) -> None:
        self._say(text)

    def close(self) -> None:
        self.progress.stop()


class PlainView:
    """One line per logged step and per event, for logs and pipes."""

    def __init__(self, total_steps: int, stream: Any = None) -> None:
        self.total = total_steps
        self.stream = stream or sys.stdout

    def _print(self, text: str) -> None:
        _line(text, self.stream)

    def attempt_started(self, attempt: int, precision: str, start_step: int, resumed: str | None) -> None:
        self._print(started_line(attempt, precision, start_step, resumed))

    def step(self, point: Point) -> None:
        self._print(
            f"step {point.step}/{self.total} {point.precision} a{point.attempt} "
            f"loss {_fmt(point.loss, '.4f')} scale {_fmt(point.loss_scale, '.0f')} "
            f"grad {_fmt(point.grad_norm, '.3f')} {_fmt(point.samples_per_second, '.1f')} samples/s"
        )

    def attempt_ended(self, attempt: int, precision: str, reason: str, message: str) -> None:
        self._print(f"attempt {attempt} ({precision}) ended: {reason}" + (f": {message}" if message else ""))

    def fallback(self, from_precision: str, to_precision: str, step: int, reason: str) -> None:
        self._print(change_line(from_precision, to_precision, step, reason))

    def info(self, text: str, **fields: Any) -> None:
        self._print(text)

    def close(self) -> None:
        pass


class JsonView:
    """One JSON object per line and event."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, event: str, **fields: Any) -> None:
        _line(json_line(event, **fields), self.stream)

    def attempt_started(self, attempt: int, precision: str, start_step: int, resumed: str | None) -> None:
        self._emit("attemptStarted", attempt=attempt, precision=precision, startStep=start_step, resumeFrom=resumed)

    def step(self, point: Point) -> None:
        self._emit(
            "step",
            attempt=point.attempt,
            precision=point.precision,
            step=point.step,
            loss=point.loss,
            lossScale=point.loss_scale,
            gradNorm=point.grad_norm,
            overflowSteps=point.overflow_steps,
            samplesPerSecond=point.samples_per_second,
        )

    def attempt_ended(self, attempt: int, precision: str, reason: str, message: str) -> None:
        self._emit("attemptEnded", attempt=attempt, precision=precision, reason=reason, message=message)

    def fallback(self, from_precision: str, to_precision: str, step: int, reason: str) -> None:
        self._emit(
            "precisionFallback", fromPrecision=from_precision, toPrecision=to_precision, step=step, reason=reason
        )

    def info(self, text: str, **fields: Any) -> None:
        self._emit("info", message=text, **fields)

    def close(self) -> None:
        pass


def make_view(mode: Mode | None, total_steps: int) -> ProgressView:
    """Pick the view: explicit mode, else rich on a terminal and plain lines otherwise."""
    if mode is None:
        mode = "rich" if sys.stdout.isatty() else "plain"
    if mode == "json":
        return JsonView()
    if mode == "rich":
        return RichView(total_steps)
    return PlainView(total_steps)
