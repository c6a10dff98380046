"""The quality gate: eval in the attempt's precision and in fp32 at the same weights; a drift
beyond validation.maxLossDelta twice in a row ends the precision (QualityDrift)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from mpjob_contract.api import Validation
from mpjob_contract.codes import ExitCode
from mpjob_trainer.distributed import World
from mpjob_trainer.session.quality import Evaluation, QualityGate, relative_delta
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit


def gated(precision: str, steps: int, **args: object) -> dict:
    return spec(
        task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, **args}},
        training={"steps": steps, "batchSize": 16, "logEvery": 5},
        precision={"mode": precision},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )


@pytest.mark.process
def test_a_precision_whose_eval_loss_drifts_from_fp32_ends_by_the_gate(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, gated("bf16", 60, cancellationOffset=1000), "bf16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    assert run.report is not None and run.report.message.startswith("QualityDrift: ")
    evals = run.of("eval")
    assert len(evals) >= 2 and all(e["delta"] > 0.05 for e in evals[-2:])
    assert all(math.isfinite(s["loss"]) for s in run.of("step"))  # the training loss never went non-finite
    assert run.report.replay is None  # a drift is not replayed: fp32 is the reference already


@pytest.mark.process
def test_a_stable_workload_never_trips_the_gate_over_a_long_run(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, gated("bf16", 400), "bf16")
    assert run.code == 0, run.stderr
    evals = run.of("eval")
    assert len(evals) == 40 and max(e["delta"] for e in evals) < 0.05


@pytest.mark.process
def test_fp32_attempts_evaluate_once_with_no_delta(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, gated("fp32", 20, cancellationOffset=1000), "fp32")
    assert run.code == 0, run.stderr
    assert [e["delta"] for e in run.of("eval")] == [0.0, 0.0]
    assert all(e["loss"] == e["lossFp32"] for e in run.of("eval"))


def test_one_excursion_is_recorded_and_only_two_in_a_row_end_the_precision() -> None:
    gate = QualityGate(lambda: 0.0, Validation(every_steps=10, max_loss_delta=0.05), World(0, 1, 0), None)  # type: ignore[arg-type]

    def ev(step: int, delta: float) -> Evaluation:
        return Evaluation(step=step, loss=1.0, loss_fp32=1.0, delta=delta, seconds=0.0)

    for step, delta in zip((10, 20, 30, 40), (0.2, 0.01, 0.2, 0.01), strict=True):
        assert gate.judge(ev(step, delta)) is None
    assert gate.judge(ev(50, 0.2)) is None
    fault = gate.judge(ev(60, 0.06))
    assert fault is not None and re.search(r"relative delta 0\.06 > validation\.maxLossDelta=0\.05", str(fault))
    assert relative_delta(1.1, 1.0) == pytest.approx(0.1) and relative_delta(math.nan, 1.0) == math.inf


def test_an_evaluation_run_again_after_a_rollback_is_not_a_second_one_in_a_row() -> None:
    """A spike or bad data rolls back to a checkpoint before an evaluation and the catch-up evaluates
    that step again: the streak is the one a straight run has at that step, not one more."""
    gate = QualityGate(lambda: 0.0, Validation(every_steps=10, max_loss_delta=0.05), World(0, 1, 0), None)  # type: ignore[arg-type]

    def ev(step: int, delta: float) -> Evaluation:
        return Evaluation(step=step, loss=1.0, loss_fp32=1.0, delta=delta, seconds=0.0)

    assert gate.judge(ev(40, 0.01)) is None
    assert gate.judge(ev(50, 0.2)) is None  # one excursion; a spike at 55 rolls back to step 40's checkpoint
    assert gate.judge(ev(50, 0.2)) is None  # caught up: step 50 evaluated again, still the one excursion
    assert gate.judge(ev(60, 0.2)) is not None  # the second in a row, as in a straight run
    gate = QualityGate(lambda: 0.0, Validation(every_steps=10, max_loss_delta=0.05), World(0, 1, 0), None)  # type: ignore[arg-type]
    assert gate.judge(ev(40, 0.2)) is None  # kept by the checkpoint at step 40 the rollback restores
    assert gate.judge(ev(50, 0.01)) is None
    assert gate.judge(ev(50, 0.2)) is not None  # re-run after the rollback: 40 and 50 in a row
