"""A fallback made in place, as the trainer's metrics endpoint tells it: the change's series (what
the operator records the new attempt from, parsed by its own reader) and every attempt series
moved to the new attempt and precision labels, its start step the change's."""

from __future__ import annotations

import pytest
import torch
from prometheus_client import generate_latest

from mpjob.controller.exposition import parse
from mpjob.controller.progress import changes_found, figures
from mpjob_contract import metrics as names
from mpjob_contract.report import InPlaceChange
from mpjob_trainer.distributed import World
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.progress import Interval, Progress

pytestmark = pytest.mark.unit


def test_a_change_is_a_series_the_operator_reads_and_the_attempt_series_move_to_its_labels() -> None:
    metrics = TrainerMetrics("j", "ns", attempt=0, precision="fp16")
    metrics.step.set(50)
    metrics.total_steps.set(80)
    metrics.overflow_steps.inc(3)
    made = InPlaceChange(
        attempt=1, step=50, start_step=40, from_precision="fp16", to_precision="bf16",
        rule="MaxNonFiniteLosses", message='5 non-finite losses; "quoted" \\ and more', recovery_seconds=0.02,
    )  # fmt: skip
    metrics.changed(made)

    new = {"job": "j", "namespace": "ns", "attempt": "1", "precision": "bf16"}
    old = {**new, "attempt": "0", "precision": "fp16"}
    value = metrics.registry.get_sample_value
    assert value(names.STEP, new) == 40 and value(names.TOTAL_STEPS, new) == 80  # at its start until it trains
    assert value(names.START_STEP, new) == 40  # where the new attempt began, not the launch's 0
    assert value(names.INFO, new) == 1 and value(names.INFO, old) is None
    assert value(names.OVERFLOW_STEPS + "_total", new) == 0  # a new attempt's counters start afresh
    assert value(names.STEP, old) is None

    text = generate_latest(metrics.registry).decode()
    assert changes_found(figures(parse(text), precision="bf16")) == [made]
    assert "loss" not in figures(parse(text), precision="bf16")  # the new attempt's fresh 0 is no loss

    metrics.changed(made.model_copy(update={"attempt": 2, "from_precision": "bf16", "to_precision": "fp32"}))
    found = changes_found(figures(parse(generate_latest(metrics.registry).decode()), precision="fp32"))
    assert [(c.attempt, c.to_precision) for c in found] == [(1, "bf16"), (2, "fp32")]  # both kept, in order


@pytest.mark.parametrize("how", ["in place", "auto measured"])
def test_an_attempt_under_new_labels_shows_no_evaluation_it_has_not_made(how: str) -> None:
    """The gate's gauges are -1 (none yet) under the new labels too, so the operator's reading has
    no eval loss: a fresh gauge's 0 once reached status.evalLoss after every change in place."""
    metrics = TrainerMetrics("j", "ns", attempt=0, precision="fp16" if how == "in place" else "auto")
    metrics.start_step.set(40)  # the trainer has resumed: its figures are readings
    metrics.step.set(50)
    metrics.evaluated(2.5, 2.4, 0.04, 0.1)
    if how == "in place":
        metrics.changed(InPlaceChange(attempt=1, step=50, start_step=40, from_precision="fp16", to_precision="bf16",
                                      rule="MaxNonFiniteLosses", message="m", recovery_seconds=0.02))  # fmt: skip
    else:
        metrics.relabel("bf16")
    metrics.step.set(60)
    seen = figures(parse(generate_latest(metrics.registry).decode()), precision="bf16")
    assert seen["step"] == 60 and "evalLoss" not in seen and "evalLossDelta" not in seen
    metrics.evaluated(2.2, 2.1, 0.05, 0.1)
    seen = figures(parse(generate_latest(metrics.registry).decode()), precision="bf16")
    assert (seen["evalLoss"], seen["evalLossDelta"]) == (2.2, 0.05)


def test_an_attempt_begun_in_place_counts_every_overflow_its_guard_counted() -> None:
    """The new attempt's counters start at 0 under its labels, as its guard's do: each interval
    after the change adds what the guard counted in it, all of it, not what it counted beyond the
    launched attempt's last reading (a new attempt's 5 overflow steps once read as 2)."""
    metrics = TrainerMetrics("j", "ns", attempt=0, precision="fp16")
    progress = Progress(metrics, lambda *a, **k: None, World(0, 1, 0), torch.device("cpu"))

    def interval(step: int, overflows: int, non_finite: int) -> None:
        progress.report(Interval(step, "fp16", 1.0, None, None, None, overflows, non_finite, step))

    interval(40, 3, 2)  # the launched attempt's guard, read
    metrics.changed(InPlaceChange(attempt=1, step=45, start_step=40, from_precision="fp16", to_precision="fp32",
                                  rule="MaxNonFiniteLosses", message="m", recovery_seconds=0.02))  # fmt: skip
    interval(50, 5, 4)  # the new attempt's guard, counted from nothing since the change
    new = {"job": "j", "namespace": "ns", "attempt": "1", "precision": "fp32"}
    value = metrics.registry.get_sample_value
    assert value(names.OVERFLOW_STEPS + "_total", new) == 5
    assert value(names.NON_FINITE_LOSSES + "_total", new) == 4
    interval(60, 6, 4)
    assert value(names.OVERFLOW_STEPS + "_total", new) == 6 and value(names.NON_FINITE_LOSSES + "_total", new) == 4


@pytest.mark.parametrize("how", ["in place", "auto measured"])
def test_an_attempt_under_new_labels_shows_no_kernel_share_it_has_not_profiled(how: str) -> None:
    """The low-precision kernel share reads -1 (no profile) under the new labels: a fresh gauge's
    0 once read as a profile that found no kernel in low precision at all."""
    metrics = TrainerMetrics("j", "ns", attempt=0, precision="fp16" if how == "in place" else "auto")
    metrics.low_precision_share.set(0.93)  # a profile taken in the old precision
    if how == "in place":
        metrics.changed(InPlaceChange(attempt=1, step=50, start_step=40, from_precision="fp16", to_precision="bf16",
                                      rule="MaxNonFiniteLosses", message="m", recovery_seconds=0.02))  # fmt: skip
    else:
        metrics.relabel("bf16")
    labels = {"job": "j", "namespace": "ns", "attempt": "1" if how == "in place" else "0", "precision": "bf16"}
    assert metrics.registry.get_sample_value(names.LOW_PRECISION_KERNEL_SHARE, labels) == -1
