"""The fp8 rung through the operator on the real control plane (fp8 emulated on the node agent's
CPU): an fp8-only drift falls back to bf16 with the same Events and attempts[] as an fp16
fallback, and fp8 on a node without fp8 fails at the first attempt naming the device."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration


def fp8_spec(claim: str, **precision: object) -> dict:
    spec = gpt_spec(claim, steps=60, every=5)
    spec["task"] = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "fp8OutlierAtStep": 15}}
    spec["training"]["batchSize"] = 16
    spec["precision"] = {"mode": "fp8", "fallback": ["bf16", "fp32"], **precision}
    spec["validation"] = {"everySteps": 10, "maxLossDelta": 0.05}
    return spec


def test_an_fp8_drift_falls_back_to_bf16_with_events_and_attempts(
    operator: Operator, jobs: Jobs, namespace: str
) -> None:
    jobs.pvc("ckpt")
    jobs.create("drift8", fp8_spec("ckpt", fp8={"emulate": True}))
    status = jobs.wait_phase("drift8", ("Succeeded", "Failed"), 300)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp8", "NumericFault", 42)
    assert first["message"].startswith("QualityDrift: ")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert 0 < second["startStep"] < first["endStep"]
    assert status["precision"] == "bf16" and status["step"] == 60
    fallback = next(c for c in status["conditions"] if c["type"] == "PrecisionFallback")
    assert fallback["status"] == "True" and fallback["reason"] == "NumericFault"
    assert second["inPlace"] is True and jobs.attempt_jobs("drift8") == ["drift8-a0"]  # fp8's linears undone in place
    events = jobs.events("drift8", "AttemptStarted", "PrecisionFallback", "AttemptEnded", "Succeeded")
    assert {"AttemptStarted", "PrecisionFallback", "AttemptEnded", "Succeeded"} <= {e.reason for e in events}
    assert any(e.reason == "PrecisionFallback" and "fp8" in e.message and "bf16" in e.message for e in events)


def test_fp8_on_a_node_without_fp8_fails_at_once_naming_the_device_and_the_field(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.pvc("ckpt")
    jobs.create("nofp8", fp8_spec("ckpt"))
    status = jobs.wait_phase("nofp8", ("Failed", "Succeeded"), 120)
    assert status["phase"] == "Failed", status
    (only,) = status["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp8", "ConfigError", 43)
    assert "this process runs on cpu" in only["message"] and "precision.fp8.emulate" in only["message"]
    assert jobs.attempt_jobs("nofp8") == ["nofp8-a0"]
