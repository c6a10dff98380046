"""The run's picture: loss, loss scale (log axis) and grad norm over steps, each attempt's
precision shaded and overflow-skipped steps marked."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: always render to a file
import matplotlib.pyplot as plt

from mpjob.localrun.series import RunSeries

PRECISION_COLOURS = {"fp8": "#e76f51", "fp16": "#f4a261", "bf16": "#2a9d8f", "fp32": "#8d99ae"}


def render(series: RunSeries, path: Path, title: str) -> Path:
    """Draw the series into a PNG at `path` and return it."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True, constrained_layout=True)
    loss_ax, scale_ax, grad_ax = axes
    last_step = max([p.step for p in series.points] + [s.end_step or 0 for s in series.spans] + [1])

    for ax in axes:
        for span in series.spans:
            end = span.end_step if span.end_step is not None else last_step
            ax.axvspan(
                span.start_step,
                max(end, span.start_step + 1),
                color=PRECISION_COLOURS.get(span.precision, "#cccccc"),
                alpha=0.18,
                lw=0,
            )
    for attempt in sorted({p.attempt for p in series.points}):
        pts = [p for p in series.points if p.attempt == attempt]
        label = f"attempt {attempt} ({pts[0].precision})"
        steps = [p.step for p in pts]
        loss_ax.plot(steps, [p.loss for p in pts], label=label)
        scale_ax.plot(steps, [p.loss_scale for p in pts], label=label)
        grad_ax.plot(steps, [p.grad_norm for p in pts], label=label)

    if series.evals:  # the quality gate: eval loss in the attempt's precision and in fp32
        steps = [e.step for e in series.evals]
        loss_ax.scatter(steps, [e.loss for e in series.evals], marker="o", s=14, color="#444", label="eval loss")
        loss_ax.scatter(
            steps, [e.loss_fp32 for e in series.evals], marker="+", color="#2a9d8f", label="eval loss, fp32"
        )
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
    if any(p.loss_scale for p in series.points):
        scale_ax.set_yscale("log")
    grad_ax.set_ylabel("grad norm")
    grad_ax.set_xlabel("step")
    loss_ax.set_title(title)
    handles = [matplotlib.patches.Patch(color=c, alpha=0.3, label=p) for p, c in PRECISION_COLOURS.items()]
    if series.points:
        loss_ax.legend(loc="upper right", fontsize="small")
    grad_ax.legend(handles=handles, loc="upper right", fontsize="small", title="precision")
    if marks:
        scale_ax.legend(loc="lower left", fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
