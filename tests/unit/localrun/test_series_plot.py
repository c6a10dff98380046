"""The local run's recorded series and the plot drawn from it."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun import plot
from mpjob.localrun.plot import render
from mpjob.localrun.series import RunSeries
from mpjob_contract import events

pytestmark = pytest.mark.unit


def line(**fields: object) -> events.TrainerEvent:
    """A trainer line as `mpjob run` reads it."""
    parsed = events.parse_line(json.dumps(fields))
    assert parsed is not None, fields
    return parsed


def _recovering_series() -> RunSeries:
    series = RunSeries()
    series.begin_attempt(0, "fp16", 0)
    for step, scale, overflows in [(10, 65536.0, 0), (20, 32768.0, 1), (30, 4.0, 9), (40, 0.5, 20)]:
        series.ingest(
            0,
            "fp16",
            line(event="step", step=step, loss=2.0, lossScale=scale, gradNorm=1.0, overflowSteps=overflows),
        )
    series.end_attempt(0, 40, "NumericFault")
    series.begin_attempt(1, "bf16", 30)
    for step in (40, 50, 60):
        series.ingest(1, "bf16", line(event="step", step=step, loss=1.5, gradNorm=0.5))
    saved = line(event="checkpoint", step=60, path="/c/step-60", sha256="ab", seconds=0.1, bytes=9, **{"async": True})
    series.ingest(1, "bf16", saved)
    series.end_attempt(1, 60, "Succeeded")
    return series


def test_only_step_lines_become_points() -> None:
    series = _recovering_series()
    assert [p.step for p in series.points] == [10, 20, 30, 40, 40, 50, 60]
    assert {p.precision for p in series.points if p.attempt == 1} == {"bf16"}


def test_overflow_marks_are_steps_where_the_count_rose() -> None:
    marks = _recovering_series().overflow_marks()
    assert [(m.attempt, m.step) for m in marks] == [(0, 20), (0, 30), (0, 40)]


def test_restarting_an_attempt_replaces_its_points(tmp_path: Path) -> None:
    series = _recovering_series()
    series.begin_attempt(1, "bf16", 50)
    assert all(p.attempt == 0 for p in series.points)
    assert [s.start_step for s in series.spans if s.attempt == 1] == [50]


def test_series_round_trips_through_disk(tmp_path: Path) -> None:
    series = _recovering_series()
    series.save(tmp_path / "series.json")
    loaded = RunSeries.load(tmp_path / "series.json")
    assert loaded == series


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is no JSON")


def test_a_non_finite_figure_is_saved_as_json_and_read_back(tmp_path: Path) -> None:
    """A faulting step's nan loss made series.json hold a bare NaN, which no strict JSON parser reads."""
    series = RunSeries()
    series.begin_attempt(0, "fp16", 0)
    series.ingest(0, "fp16", line(event="step", step=20, loss="nan", lossScale=2048.0, gradNorm="inf", overflowSteps=5))
    series.save(tmp_path / "series.json")
    (point,) = json.loads((tmp_path / "series.json").read_text(), parse_constant=_no_constants)["points"]
    assert (point["loss"], point["grad_norm"], point["loss_scale"]) == ("nan", "inf", 2048.0)
    (loaded,) = RunSeries.load(tmp_path / "series.json").points
    assert math.isnan(loaded.loss or 0.0) and loaded.grad_norm == math.inf and loaded.loss_scale == 2048.0


def test_plot_is_a_real_png_of_the_series(tmp_path: Path) -> None:
    path = tmp_path / "training.png"
    render(_recovering_series(), path, "gpt-small")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1000, 800)
    # An empty series renders too (a run that failed before its first step).
    render(RunSeries(), tmp_path / "empty.png", "x")
    assert (tmp_path / "empty.png").stat().st_size > 1000


def test_a_step_its_attempt_runs_again_replaces_what_it_logged_from_there_once() -> None:
    """A rollback in place (bad data skipped at step 30, back to the checkpoint of step 20):
    the attempt logs 30 and 40 again; the plot draws each step once, the run that trained on,
    and another attempt's point at the same step stays its own."""
    series = RunSeries()
    series.begin_attempt(0, "bf16", 0)
    for step, loss in [(10, 3.0), (20, 2.0), (30, float("nan")), (25, 1.9), (30, 1.8), (40, 1.7)]:
        series.ingest(0, "bf16", line(event="step", step=step, loss=loss, gradNorm=1.0))
    series.begin_attempt(1, "fp32", 30)
    series.ingest(1, "fp32", line(event="step", step=40, loss=1.6, gradNorm=1.0))
    assert [(p.attempt, p.step, p.loss) for p in series.points] == [
        (0, 10, 3.0),
        (0, 20, 2.0),
        (0, 25, 1.9),
        (0, 30, 1.8),
        (0, 40, 1.7),
        (1, 40, 1.6),
    ]


def test_an_attempt_that_logged_one_step_is_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt stopped (Ctrl-C, a kill) after one logged step has a point in series.json and an
    entry in the legend: a line through one point, without a marker, would draw nothing there."""
    figures: list[Any] = []
    monkeypatch.setattr(plot.plt, "close", figures.append)
    series = RunSeries()
    series.begin_attempt(0, "bf16", 0)
    for step in (10, 20):
        series.ingest(0, "bf16", line(event="step", step=step, loss=2.0, gradNorm=1.0))
    series.end_attempt(0, 20, "Suspended")
    series.begin_attempt(1, "bf16", 20)
    series.ingest(1, "bf16", line(event="step", step=25, loss=1.9, lossScale=1024.0, gradNorm=0.9))
    series.end_attempt(1, 27, "Suspended")
    render(series, tmp_path / "training.png", "job")
    (fig,) = figures
    for ax in fig.axes:
        (alone,) = [drawn for drawn in ax.get_lines() if list(drawn.get_xdata()) == [25]]
        assert alone.get_marker() not in (None, "", "None", " ")


def test_a_skipped_step_is_drawn_where_the_step_lines_count_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer skips optimizer step index 41 (0-based, as events and the status keep it): the
    run's lines and summary call it step 42, and the x axis counts steps as the step lines do
    (`step 40` after 40 steps), so its line stands at 42, not 41."""
    figures: list[Any] = []
    monkeypatch.setattr(plot.plt, "close", figures.append)
    series = RunSeries()
    series.begin_attempt(0, "fp16", 0)
    skipped = line(
        event="dataSkipped",
        cause="data",
        steps=[41],
        samples=[{"first": 1234, "last": 1234}],
        fromStep=40,
        skippedSteps=1,
    )
    series.ingest_skip(0, skipped)
    render(series, tmp_path / "training.png", "job")
    (fig,) = figures
    (mark,) = [drawn for drawn in fig.axes[0].get_lines() if drawn.get_label() == "skipped (data)"]
    assert set(mark.get_xdata()) == {42}
