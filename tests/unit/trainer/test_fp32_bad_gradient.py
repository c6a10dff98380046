"""An fp32 attempt's own non-finite step is its verdict (no replay): the step where the trouble
began, a non-finite loss or a non-finite gradient. A sample whose loss is finite and whose
gradient is not spoils the weights at its step; the first non-finite loss comes a step later,
on healthy samples."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("bad_gradient_script.py"))


@pytest.mark.process
@pytest.mark.parametrize("on_bad_data", ["skip", "fail"])
def test_an_fp32_step_with_a_finite_loss_and_a_non_finite_gradient_is_the_one_named(
    tmp_path: Path, on_bad_data: str
) -> None:
    # Sample 25 is trained at step 6 (index); its update leaves the weights non-finite, and step 7's
    # samples (28..31), healthy, are the first with a non-finite loss.
    job = spec(
        training={"steps": 20, "batchSize": 4, "logEvery": 5},
        precision={"mode": "fp32", "guard": {"onBadData": on_bad_data}},
        checkpoint={"everySteps": 10, "keep": 5},
    )
    extra = {"BAD": "25", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = run_trainer(tmp_path, job, "fp32", argv=[SCRIPT], extra=extra)
    (replay,) = run.of("replay")
    assert replay["verdict"] == "data" and replay["offendingStep"] == 6, replay
    assert run.report is not None
    if on_bad_data == "fail":
        message = run.report.message or ""  # in 1-based steps, as the log lines count
        assert run.code == ExitCode.NON_FINITE_IN_FP32 and "so step 7 being non-finite" in message, message
        return
    assert run.code == ExitCode.SUCCESS, (run.report, run.stderr[-3000:])
    (skipped,) = run.of("dataSkipped")
    assert skipped["steps"] == [6] and skipped["samples"] == [{"first": 24, "last": 27}]
    assert run.report.precision == "fp32" and run.report.skipped is not None


@pytest.mark.process
def test_a_non_finite_gradient_at_the_step_before_a_checkpoint_is_skipped_not_blamed_on_fp32(tmp_path: Path) -> None:
    # Sample 37 is trained at step 9, the last before the checkpoint at step 10: no loss went non-finite,
    # the weights did, which the checkpoint's finite-state check finds; the step is still the data's.
    job = spec(training={"steps": 20, "batchSize": 4, "logEvery": 5}, checkpoint={"everySteps": 10, "keep": 5})
    run = run_trainer(
        tmp_path, job, "fp32", argv=[SCRIPT], extra={"BAD": "37", "PYTHONPATH": os.pathsep.join(sys.path)}
    )
    assert run.code == ExitCode.SUCCESS, run.report
    (skipped,) = run.of("dataSkipped")
    assert skipped["steps"] == [9] and skipped["samples"] == [{"first": 36, "last": 39}]
