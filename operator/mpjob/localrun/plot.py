"""The run's picture: loss, loss scale (log axis) and grad norm over steps, each attempt's
precision shaded (up to where the next attempt began; steps trained again after a rollback
hatched, so no two colours mix), overflow-skipped steps marked, and steps skipped as bad data
or loss spikes drawn as vertical lines. The legend names the precisions the run used.

The loss scale and the precision spans are drawn from the status's own timeline
(`status.timeline`, what `kubectl get mpj -o yaml` shows of a job on a cluster) when the run has
one; loss and grad norm from the trainer's step lines (the series)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import IO

import matplotlib

matplotlib.use("Agg")  # no display: always render to a file
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import Patch

from mpjob.localrun.series import RunSeries, Span
from mpjob_contract.timeline import PrecisionTimeline

PRECISION_COLOURS = {"fp8": "#e76f51", "fp16": "#f4a261", "bf16": "#2a9d8f", "fp32": "#8d99ae"}


SKIP_COLOURS = {"data": "#6a040f", "spike": "#7209b7"}
#: Steps an attempt trained and the next attempt trained again (it resumed from an earlier checkpoint).
RETRAINED_HATCH = "//"
RETRAINED_LABEL = "trained again (rolled back)"


def _skipped_steps(series: RunSeries, ax: plt.Axes) -> None:
    """A dashed line at each skipped step, one legend entry per cause. A skip names the step's
    0-based index (as events and the status keep it); the x axis counts steps done, as the step
    lines and every message do (`describe_steps`): index 41 is step 42, drawn there."""
    labelled: set[str] = set()
    for skip in series.skips:
        label = None if skip.cause in labelled else f"skipped ({skip.cause})"
        labelled.add(skip.cause)
        ax.axvline(skip.step + 1, color=SKIP_COLOURS.get(skip.cause, "#000"), ls="--", lw=1, label=label)


def render(series: RunSeries, into: Path | IO[bytes], title: str, *, timeline: PrecisionTimeline | None = None) -> None:
    """Draw the series (and the status's timeline, when given) as a PNG into a file (a path, or one open)."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    # Fixed margins, room for the axis labels and the title: a layout engine measuring every
    # text's extent doubled the drawing's CPU (0.48 s -> 0.27 s), paid at the end of each run.
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.07, top=0.95, hspace=0.08)
    loss_ax, scale_ax, grad_ax = axes
    spans = _spans(series, timeline)
    last_step = max([p.step for p in series.points] + [s.end_step or 0 for s in spans] + [1])
    for ax in axes:
        _shade(ax, spans, last_step)
    for attempt in sorted({p.attempt for p in series.points}):
        pts = [p for p in series.points if p.attempt == attempt]
        label = f"attempt {attempt} ({pts[0].precision})"
        steps = [p.step for p in pts]
        _line(loss_ax, steps, [p.loss for p in pts], label)
        _line(grad_ax, steps, [p.grad_norm for p in pts], label)
        if timeline is None:
            _line(scale_ax, steps, [p.loss_scale for p in pts], label)
    if timeline is not None:
        _scale_history(scale_ax, timeline)
    if series.evals:  # the quality gate: eval loss in the attempt's precision and in fp32
        steps = [e.step for e in series.evals]
        loss_ax.scatter(steps, [e.loss for e in series.evals], marker="o", s=14, color="#444", label="eval loss")
        loss_ax.scatter(
            steps, [e.loss_fp32 for e in series.evals], marker="+", color="#2a9d8f", label="eval loss, fp32"
        )
    _skipped_steps(series, loss_ax)
    marks = [m for m in series.overflow_marks() if m.loss_scale]
    if marks:
        scale_ax.scatter(
            [m.step for m in marks],
            [m.loss_scale for m in marks],
            marker="x",
            color="#d62828",
            zorder=5,
            label="overflow-skipped steps",
        )
    loss_ax.set_ylabel("loss")
    scale_ax.set_ylabel("loss scale")
    if any(p.loss_scale for p in series.points) or (timeline is not None and timeline.loss_scale):
        scale_ax.set_yscale("log")
    grad_ax.set_ylabel("grad norm")
    grad_ax.set_xlabel("step")
    loss_ax.set_title(title)
    handles = _precision_handles(spans)
    if series.points:
        loss_ax.legend(loc="upper right", fontsize="small")
    if handles:
        grad_ax.legend(handles=handles, loc="upper right", fontsize="small", title="precision")
    if marks or (timeline is not None and timeline.loss_scale):
        scale_ax.legend(loc="lower left", fontsize="small")
    if isinstance(into, Path):
        into.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(into, dpi=100, format="png")
    plt.close(fig)


def _line(ax: Axes, steps: list[int], values: list[float | None], label: str) -> None:
    """One attempt's figure over its steps, a point with no finite neighbour marked: a line
    draws nothing through a lone point (an attempt stopped after its first logged step, a finite
    loss between two non-finite ones), and the legend would name an attempt the plot does not show."""
    finite = [v is not None and math.isfinite(v) for v in values]
    lone = [
        i for i, ok in enumerate(finite) if ok and not any(finite[j] for j in (i - 1, i + 1) if 0 <= j < len(finite))
    ]
    drawn = [math.nan if v is None else v for v in values]  # no figure: a gap, as a non-finite one
    ax.plot(steps, drawn, label=label, marker="o", ms=3, markevery=lone)


def _spans(series: RunSeries, timeline: PrecisionTimeline | None) -> list[Span]:
    """The precision of each step range: the status's timeline when it has one, else the series'."""
    if timeline is None or not timeline.precision:
        return series.spans
    return [Span(s.attempt, s.precision, s.from_step, s.to_step) for s in timeline.precision]


def _shade(ax: Axes, spans: list[Span], last_step: int) -> None:
    """Each attempt's precision from its start up to where a later attempt began again (or its
    own end): no two shades overlap, each step in the colour of the attempt that trained it
    last. Steps a later attempt trained again (it resumed from an earlier checkpoint) are
    hatched: trained before, in the attempt whose shade ends there."""
    for position, span in enumerate(spans):
        end = max(span.end_step if span.end_step is not None else last_step, span.start_step + 1)
        shown = min(end, _later_start(spans, position, default=end))
        if shown > span.start_step:
            colour = PRECISION_COLOURS.get(span.precision, "#cccccc")
            ax.axvspan(span.start_step, shown, color=colour, alpha=0.18, lw=0)
        if end > max(shown, span.start_step):
            ax.axvspan(
                max(shown, span.start_step), end, facecolor="none", edgecolor="#666666", hatch=RETRAINED_HATCH, lw=0
            )


def _later_start(spans: list[Span], position: int, *, default: int) -> int:
    """The earliest step an attempt after `spans[position]` began at (`default`: none after it)."""
    return min((s.start_step for s in spans[position + 1 :]), default=default)


def _precision_handles(spans: list[Span]) -> list[Patch]:
    """Legend entries: the precisions the run's attempts used (in the order first used), and the
    hatch of retrained steps when a later attempt trained some steps again."""
    used = dict.fromkeys(span.precision for span in spans)
    handles = [Patch(color=PRECISION_COLOURS.get(p, "#cccccc"), alpha=0.3, label=p) for p in used]
    ends = [s.end_step for s in spans]
    if any(end is not None and end > _later_start(spans, i, default=end) for i, end in enumerate(ends)):
        handles.append(Patch(facecolor="none", edgecolor="#666666", hatch=RETRAINED_HATCH, label=RETRAINED_LABEL))
    return handles


def _scale_history(ax: Axes, timeline: PrecisionTimeline) -> None:
    """status.timeline.lossScale, one line of points per attempt (its checkpoints and big changes)."""
    for attempt in sorted({p.attempt for p in timeline.loss_scale}):
        pts = [p for p in timeline.loss_scale if p.attempt == attempt]
        ax.plot([p.step for p in pts], [p.scale for p in pts], marker="o", ms=3, label=f"attempt {attempt}")
