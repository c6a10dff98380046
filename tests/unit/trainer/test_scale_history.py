"""The trainer's loss-scale history: what its termination report carries for status.timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec
from tests.unit.trainer.test_numerics import OVERFLOWING

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_the_report_shows_the_loss_scale_collapse_before_the_fault(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING, checkpoint={"everySteps": 10}), "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    assert run.report is not None
    points = dict(run.report.loss_scales)
    # A point at every checkpoint (10, 20) and one where the scale fell two octaves or more.
    assert {10, 20} <= set(points), points
    fault_step, collapsed = run.report.loss_scales[-1]
    assert fault_step > 20 and collapsed <= points[20] / 4, points
    assert collapsed == run.report.counters.loss_scale


@pytest.mark.process
def test_a_bf16_attempt_reports_no_loss_scale(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING), "bf16")
    assert run.code == 0, run.stderr
    assert run.report is not None and run.report.loss_scales == []
