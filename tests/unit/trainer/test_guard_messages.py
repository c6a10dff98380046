"""The guard's messages say when the trouble began, when the guard saw it and, for the
counters it reads at intervals, which interval: a reader can tell a late check from a bug."""

from __future__ import annotations

import math
import re

import pytest
import torch

from mpjob_contract.api import Guard
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import NumericFault
from mpjob_trainer.guard import NumericGuard

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def guard(**spec: object) -> NumericGuard:
    return NumericGuard(Guard.model_validate(spec), CPU, World(rank=0, size=1, local_rank=0))


def train(g: NumericGuard, steps: range, *, non_finite_from: int | None = None, applied: bool = True) -> None:
    """Close 1-based steps `steps`; from `non_finite_from` on the loss is NaN, else 1."""
    for step in steps:
        g.begin_step()
        bad = non_finite_from is not None and step >= non_finite_from
        g.observe_loss(torch.tensor(math.nan if bad else 1.0))
        if applied:
            g.optimizer_stepped()
        fault = g.end_step(step, uses_scaler=True)
        if fault is not None:
            raise fault  # the session's edge does so: the tests look at it the same way


def test_non_finite_losses_name_the_first_step_the_detection_and_the_previous_read() -> None:
    g = guard(maxNonFiniteLosses=3)
    train(g, range(1, 11))
    assert g.check(10, g.read(None), 1.0, 1.0) is None  # a clean read at step 10
    train(g, range(11, 21), non_finite_from=14)
    fault = g.check(20, g.read(None), math.nan, None)
    assert fault is not None and fault.rule == "MaxNonFiniteLosses"
    assert str(fault) == (
        "7 non-finite losses in this attempt (guard.maxNonFiniteLosses=3): the first at step 14, detected at "
        "step 20 (the guard reads its counters at log and checkpoint steps; the previous read was at step 10)"
    )


def test_non_finite_losses_of_rolled_back_steps_are_not_counted_in_the_message_as_they_are_not_by_the_rule() -> None:
    """A suspect step rolled back and run again (the data rung): its first non-finite loss is
    forgiven, so the guard trips at 3 of its own, and says 3, not 4."""
    g = guard(maxNonFiniteLosses=3)
    train(g, range(1, 11))
    assert g.check(10, g.read(None), 1.0, 1.0) is None
    train(g, range(11, 15), non_finite_from=14)
    assert g.check(14, g.read(None), math.nan, None) is None  # 1: a suspect, replayed and run again
    g.rewind(10)
    train(g, range(11, 17), non_finite_from=14)
    fault = g.check(16, g.read(None), math.nan, None)
    assert fault is not None and str(fault).startswith(
        "3 non-finite losses in this attempt (guard.maxNonFiniteLosses=3; 1 more before a rollback, not held"
        " against it): the first at step 14, detected at step 16"
    )


def test_the_first_non_finite_step_is_the_attempts_not_the_last_read_windows() -> None:
    g = guard(maxNonFiniteLosses=5)
    g.start_at(40)
    train(g, range(41, 46), non_finite_from=43)
    assert g.check(45, g.read(None), math.nan, None) is None  # 3 so far: under the limit
    train(g, range(46, 51), non_finite_from=46)
    fault = g.check(50, g.read(None), math.nan, None)
    assert re.search(r"the first at step 43, detected at step 50 .*previous read was at step 45", str(fault))


def test_a_fault_at_the_first_read_says_the_attempts_start() -> None:
    g = guard(maxNonFiniteLosses=1)
    g.start_at(20)
    train(g, range(21, 26), non_finite_from=24)
    started = r"the first at step 24, detected at step 25 .*since the attempt started at step 20"
    fault = g.check(25, g.read(None), math.nan, None)
    assert fault is not None and re.search(started, str(fault))


def test_consecutive_overflows_name_the_first_skipped_step() -> None:
    g = guard(maxConsecutiveOverflows=5)
    train(g, range(1, 8))
    with pytest.raises(NumericFault) as caught:
        train(g, range(8, 20), applied=False)
    assert str(caught.value) == (
        "5 consecutive overflow-skipped steps (guard.maxConsecutiveOverflows=5): the first at step 8, "
        "detected at step 12 (checked every step)"
    )


def test_a_collapsed_loss_scale_names_the_first_skipped_step_and_the_interval() -> None:
    g = guard(maxConsecutiveOverflows=100, minLossScale=1.0)
    train(g, range(1, 6))
    assert g.check(5, g.read(None), 1.0, 1.0) is None
    train(g, range(6, 9), applied=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=0.5)
    fault = g.check(8, g.read(scaler), 1.0, None)
    assert fault is not None and fault.rule == "LossScaleCollapsed"
    assert str(fault) == (
        "loss scale 0.5 below guard.minLossScale=1: overflow-skipped steps since the last good checkpoint, the "
        "first at step 6, detected at step 8 (the guard reads its counters at log and checkpoint steps; the "
        "previous read was at step 5)"
    )


def test_a_loss_scale_below_the_floor_with_no_overflow_says_so() -> None:
    """A guard.minLossScale above lossScale.init ends fp16 at the first read though no step
    overflowed: the message says that, not that overflow-skipped steps brought the scale down."""
    g = guard(minLossScale=1e6)
    train(g, range(1, 6))
    fault = g.check(5, g.read(torch.amp.GradScaler("cpu", init_scale=65536.0)), 1.0, 1.0)
    assert fault is not None and fault.rule == "LossScaleCollapsed"
    assert str(fault) == (
        "loss scale 65536 below guard.minLossScale=1e+06 with no overflow since the last good checkpoint: "
        "precision.lossScale.init is under the floor, detected at step 5 (the guard reads its counters at log and "
        "checkpoint steps; the first read since the attempt started at step 0)"
    )
