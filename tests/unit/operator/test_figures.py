"""Status figures to sensible digits: `kubectl get mpj` reads LOSS 4.1715, not 4.171467304229736,
whichever path wrote the figure (live progress, the termination report, `mpjob run`)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from mpjob.controller.exposition import Exposition
from mpjob.controller.progress import figures
from mpjob.planning.figures import SIGNIFICANT_DIGITS, figure, round_figures, round_sig, rounded
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract import metrics as tm
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import Counters, TerminationReport
from mpjob_contract.timeline import LossScalePoint, PrecisionTimeline
from tests.unit.operator.live_reads import progress_patch

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (4.171467304229736, 4.1715),
        (0.000123456789, 0.00012346),
        (12345.678, 12346.0),
        (98765432.1, 98765000.0),
        (-0.0123456, -0.012346),
        (2.5, 2.5),
        (0.0, 0.0),
    ],
)
def test_round_sig_keeps_five_significant_digits(value: float, kept: float) -> None:
    assert SIGNIFICANT_DIGITS == 5
    assert round_sig(value) == kept
    assert round_sig(round_sig(value)) == round_sig(value)  # a rounded figure is not rounded again


def test_round_sig_leaves_what_has_no_digits_alone() -> None:
    assert round_sig(math.inf) == math.inf and math.isnan(round_sig(math.nan))
    assert round_sig(1.23456, 2) == 1.2


@pytest.mark.parametrize("scale", [65536.0, 131072.0, 2.0**24, 2.0**-3, 1.0])
def test_a_power_of_two_loss_scale_stays_exact(scale: float) -> None:
    assert figure(scale) == scale


def test_a_loss_scale_that_is_no_power_of_two_is_rounded() -> None:
    assert figure(1234.56789) == 1234.6


def test_the_live_progress_patch_holds_rounded_figures() -> None:
    values = {
        tm.STEP: 120.0,
        tm.LOSS: 4.171467304229736,
        tm.LOSS_SCALE: 131072.0,
        tm.SAMPLES_PER_SECOND: 1523.4567891,
        tm.EVAL_LOSS: 4.3333333333,
        tm.EVAL_LOSS_DELTA: 0.001234567,
        tm.OVERFLOW_STEPS + "_total": 7.0,
    }
    status = MixedPrecisionJobStatus(phase="Running", attempts=[AttemptStatus(index=0, precision="fp16")])
    patch = progress_patch(status, figures(Exposition(values=values), precision="fp16"))
    assert patch["loss"] == 4.1715 and patch["lossScale"] == 131072.0
    assert patch["samplesPerSecond"] == 1523.5 and patch["evalLoss"] == 4.3333
    assert patch["evalLossDelta"] == 0.0012346 and patch["step"] == 120 and patch["overflowSteps"] == 7
    # A reading that rounds to what the status holds already writes nothing.
    status.loss, status.loss_scale, status.samples_per_second = 4.1715, 131072.0, 1523.5
    status.eval_loss, status.eval_loss_delta, status.step, status.overflow_steps = 4.3333, 0.0012346, 120, 7
    status.timeline = PrecisionTimeline(loss_scale=[LossScalePoint(step=120, scale=131072.0, attempt=0)])
    values[tm.LOSS] = 4.17149
    assert progress_patch(status, figures(Exposition(values=values), precision="fp16")) == {}


def test_the_termination_reports_figures_are_rounded_too() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}, "precision": {"mode": "fp16"}})
    status = reconcile(spec, MixedPrecisionJobStatus(), 1, {}, T0).status
    counters = Counters(overflowSteps=2, lossScale=2048.0, loss=3.14159265358979)
    report = TerminationReport(reason=Reason.SUCCEEDED, step=60, precision="fp16", counters=counters)
    done = {0: JobView(0, "Complete", pods=(PodView("p", 0, "Succeeded", False, 0, report.to_message()),))}
    final = reconcile(spec, status, 1, done, T0).status
    assert final.phase == "Succeeded" and final.loss == 3.1416 and final.loss_scale == 2048.0


def test_round_figures_and_rounded_are_one_rule_for_models_and_patches() -> None:
    status = MixedPrecisionJobStatus(
        step=3, loss=1.0000049, loss_scale=3000.123, samples_per_second=9.87654321, eval_loss=None
    )
    round_figures(status)
    assert (status.step, status.loss, status.loss_scale, status.samples_per_second) == (3, 1.0, 3000.1, 9.8765)
    assert status.eval_loss is None
    patch = rounded({"loss": 1.0000049, "lossScale": 3000.123, "step": 3, "message": "x", "evalLoss": None})
    assert patch == {"loss": 1.0, "lossScale": 3000.1, "step": 3, "message": "x", "evalLoss": None}
