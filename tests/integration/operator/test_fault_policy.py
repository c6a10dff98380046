"""Faults through the operator on the real control plane: a bad record before the first
checkpoint is skipped in the first precision (the attempt's step 0 is the rollback target),
and a job's spec.faultPolicy rule ends an fp16 overflow at once instead of falling back."""

from __future__ import annotations

import pytest

from mpjob_trainer.data import StepSampler
from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration

SAMPLES, BATCH, SEED = 64, 8, 0


def mlp_spec(claim: str, mode: str, *, every: int, **args: object) -> dict:
    spec = gpt_spec(claim, steps=30, every=every)
    spec["task"] = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": SAMPLES, **args}}
    spec["training"].update(batchSize=BATCH, seed=SEED)
    spec["precision"] = {"mode": mode, "fallback": ["fp32"] if mode == "bf16" else ["bf16", "fp32"]}
    return spec


def test_a_bad_record_at_step_4_with_checkpoints_every_20_is_skipped_in_bf16(operator: Operator, jobs: Jobs) -> None:
    bad = StepSampler(SAMPLES, BATCH, 1, 1, 0, SEED).step_indices(3)[0]  # served at step 4, again every epoch
    jobs.pvc("ckpt")
    jobs.create("early", mlp_spec("ckpt", "bf16", every=20, nonFiniteSamples=[bad]))
    status = jobs.wait_phase("early", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (attempt["precision"], attempt["reason"]) == ("bf16", "Succeeded")
    (step,) = status["skipped"]["steps"]
    assert (step["cause"], step["step"], step["samples"]) == ("data", 3, [{"first": bad, "last": bad}])
    assert status["lastCheckpoint"]["step"] == 30


def test_numeric_fault_fail_ends_an_fp16_overflow_in_one_attempt_naming_the_rule(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", "fp16", every=10, overflowAtStep=15)
    spec["faultPolicy"] = {"rules": [{"fault": "NumericFault", "action": "Fail"}]}
    jobs.create("strict", spec)
    status = jobs.wait_phase("strict", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Failed", status
    (only,) = status["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NumericFault", 42)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "spec.faultPolicy.rules[0] (fault: NumericFault, action: Fail)" in failed["message"]
    assert jobs.attempt_jobs("strict") == ["strict-a0"]
