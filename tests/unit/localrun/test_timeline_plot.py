"""`mpjob run`'s plot draws the loss scale and the precision spans from status.timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun import plot
from mpjob.localrun.series import RunSeries
from mpjob_contract.timeline import LossScalePoint, PrecisionSpan, PrecisionTimeline

pytestmark = pytest.mark.unit


def test_the_loss_scale_panel_is_the_status_timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[Any] = []
    monkeypatch.setattr(plot.plt, "close", drawn.append)
    timeline = PrecisionTimeline(
        loss_scale=[
            LossScalePoint(step=20, scale=65536, attempt=0),
            LossScalePoint(step=27, scale=512, attempt=0),
        ],
        precision=[
            PrecisionSpan(attempt=0, precision="fp16", from_step=0, to_step=27),
            PrecisionSpan(attempt=1, precision="bf16", from_step=20, to_step=60),
        ],
    )
    path = tmp_path / "training.png"
    plot.render(RunSeries(), path, "job", timeline=timeline)
    assert path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = drawn
    scale_ax = fig.axes[1]
    (line,) = scale_ax.get_lines()
    assert list(line.get_xdata()) == [20, 27] and list(line.get_ydata()) == [65536, 512]
    assert scale_ax.get_yscale() == "log"
    shaded = [patch.get_x() for patch in scale_ax.patches if not patch.get_hatch()]
    assert shaded == [0, 20]  # one span per attempt, where each began


def drawn_figure(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, series: RunSeries, timeline: Any = None) -> Any:
    figures: list[Any] = []
    monkeypatch.setattr(plot.plt, "close", figures.append)
    plot.render(series, tmp_path / "training.png", "job", timeline=timeline)
    (fig,) = figures
    return fig


def precision_legend(fig: Any) -> list[str]:
    legend = fig.axes[2].get_legend()
    return [text.get_text() for text in legend.get_texts()]


def test_the_legend_names_only_the_precisions_the_run_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    series = RunSeries()
    series.begin_attempt(0, "bf16", 0)
    series.end_attempt(0, 40, "Succeeded")
    assert precision_legend(drawn_figure(monkeypatch, tmp_path, series)) == ["bf16"]


def test_an_attempt_is_shaded_until_the_next_began_and_its_retrained_steps_say_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 trained to step 27 and bf16 resumed from checkpoint 20: steps 20-27 were trained
    twice. No two precisions' shades overlap; those steps carry a hatch the legend names."""
    timeline = PrecisionTimeline(
        precision=[
            PrecisionSpan(attempt=0, precision="fp16", from_step=0, to_step=27),
            PrecisionSpan(attempt=1, precision="bf16", from_step=20, to_step=60),
        ],
    )
    fig = drawn_figure(monkeypatch, tmp_path, RunSeries(), timeline)
    shades = [p for p in fig.axes[0].patches if not p.get_hatch()]
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in shades] == [(0, 20), (20, 60)]
    (again,) = [p for p in fig.axes[0].patches if p.get_hatch()]
    assert (again.get_x(), again.get_x() + again.get_width()) == (20, 27)
    assert precision_legend(fig) == ["fp16", "bf16", "trained again (rolled back)"]


def test_steps_trained_again_by_any_later_attempt_are_hatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32 resumed from checkpoint 10, before where bf16 began: fp16's steps 10-20 and bf16's
    20-25 were trained again; each step is shaded in the precision that trained it last."""
    timeline = PrecisionTimeline(
        precision=[
            PrecisionSpan(attempt=0, precision="fp16", from_step=0, to_step=20),
            PrecisionSpan(attempt=1, precision="bf16", from_step=20, to_step=25),
            PrecisionSpan(attempt=2, precision="fp32", from_step=10, to_step=60),
        ],
    )
    patches = drawn_figure(monkeypatch, tmp_path, RunSeries(), timeline).axes[0].patches
    spans = [(p.get_x(), p.get_x() + p.get_width(), bool(p.get_hatch())) for p in patches]
    assert spans == [(0, 10, False), (10, 20, True), (20, 25, True), (10, 60, False)]
