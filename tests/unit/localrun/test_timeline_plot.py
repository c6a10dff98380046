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
    path = plot.render(RunSeries(), tmp_path / "training.png", "job", timeline=timeline)
    assert path.read_bytes()[:4] == b"\x89PNG"
    (fig,) = drawn
    scale_ax = fig.axes[1]
    (line,) = scale_ax.get_lines()
    assert list(line.get_xdata()) == [20, 27] and list(line.get_ydata()) == [65536, 512]
    assert scale_ax.get_yscale() == "log"
    shaded = [patch.get_x() for patch in scale_ax.patches]
    assert shaded == [0, 20]  # one span per attempt, where each began
