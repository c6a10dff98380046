"""The smarter fallback through the operator: a fault that fp32 replays too fails after one
attempt, an fp32 fallback keeps the samples per step in a split micro-batch, and running out
of GPU memory retries the same precision with a smaller micro-batch."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration

MLP = {"inputs": 8, "hidden": 16, "samples": 64}


def mlp_spec(claim: str, **args: object) -> dict:
    spec = gpt_spec(claim, steps=40)
    spec["task"] = {"builtin": "mlp", "args": {**MLP, **args}}
    spec["training"]["batchSize"] = 8
    return spec


def test_poisoned_data_fails_after_one_attempt_naming_the_step_and_samples(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", nonFiniteSamples=[17])
    spec["precision"]["guard"] = {"onBadData": "fail"}  # the replay's verdict ends it (skip: test_data_rung)
    jobs.create("poisoned", spec)
    status = jobs.wait_phase("poisoned", ("Failed", "Succeeded"), 180)
    assert status["phase"] == "Failed", status
    (only,) = status["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NonFiniteInFp32", 45)
    assert "is non-finite too" in only["message"] and "17" in only["message"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NonFiniteInFp32"
    assert jobs.attempt_jobs("poisoned") == ["poisoned-a0"]


def test_an_fp32_fallback_splits_the_micro_batch_and_an_oom_retries_smaller(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", overflowAtStep=15, outOfMemoryAbove=4)  # fp16 overflows; 8 samples never fit
    spec["precision"]["fallback"] = ["fp32"]
    jobs.create("squeezed", spec)
    status = jobs.wait_phase("squeezed", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Succeeded", status
    shapes = [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"]) for a in status["attempts"]]
    assert shapes == [
        ("fp16", "OutOfDeviceMemory", 8, 1),
        ("fp16", "NumericFault", 4, 2),  # same precision, split micro-batch: the same 8 samples per step
        ("fp32", "Succeeded", 2, 4),  # fp32 needs more memory: split again
    ]
    assert "the precision is at fault" in status["attempts"][1]["message"]
    assert status["step"] == 40 and status["precision"] == "fp32"


def test_a_transient_fault_falls_back_then_repromotes_to_fp16(operator: Operator, jobs: Jobs, namespace: str) -> None:
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", overflowAtStep=15, overflowUntilStep=20)
    spec["training"]["steps"] = 60
    spec["checkpoint"]["everySteps"] = 5
    spec["precision"]["repromoteAfterSteps"] = 10
    jobs.create("transient", spec)
    status = jobs.wait_phase("transient", ("Failed", "Succeeded"), 300)
    assert status["phase"] == "Succeeded", status
    ends = [(a["precision"], a["reason"], a["startStep"], a.get("repromoted")) for a in status["attempts"]]
    # bf16 runs 15..20 again from the checkpoint before the fault at 20; its 10 clean steps count from 20.
    assert ends == [("fp16", "NumericFault", 0, None), ("bf16", "Repromote", 15, None), ("fp16", "Succeeded", 30, True)]
    assert status["attempts"][0]["endStep"] == 20
    assert status["attempts"][1]["exitCode"] == 47 and status["precision"] == "fp16"
    fallback = next(c for c in status["conditions"] if c["type"] == "PrecisionFallback")
    assert (fallback["status"], fallback["reason"]) == ("False", "Repromoted")
    events = jobs.events("transient", "PrecisionRepromoted")
    assert any(e.reason == "PrecisionRepromoted" and "bf16 -> fp16" in e.message for e in events)
