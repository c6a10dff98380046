"""`auto` measured on the node, through the operator: the attempt's precision is the one the
trainer chose, its step times are in the status, and AMP slower than fp32 is a condition and
a Warning Event (F6)."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator, gpt_spec

pytestmark = pytest.mark.integration


def auto_spec(claim: str, delay: dict[str, float]) -> dict:
    spec = gpt_spec(claim, steps=20)
    spec["task"] = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "stepDelay": delay}}
    spec["precision"] = {"mode": "auto", "fallback": ["fp32"]}
    return spec


def test_auto_slower_than_fp32_trains_in_fp32_with_a_condition_and_an_event(
    operator: Operator, jobs: Jobs, namespace: str
) -> None:
    jobs.pvc("ckpt")
    jobs.create("measured", auto_spec("ckpt", {"bf16": 0.3}))
    status = jobs.wait_phase("measured", ("Failed", "Succeeded"), 180)
    assert status["phase"] == "Succeeded", status
    (only,) = status["attempts"]
    assert only["precision"] == "fp32" and status["precision"] == "fp32", status
    seconds = only["measuredStepSeconds"]
    assert set(seconds) == {"bf16", "fp32"} and seconds["bf16"] > 0.3 > seconds["fp32"]
    slower = next(c for c in status["conditions"] if c["type"] == "AmpSlowerThanFp32")
    assert slower["status"] == "True" and "bf16" in slower["message"] and "fp32" in slower["message"]
    events = jobs.events("measured", "AmpSlowerThanFp32", "Succeeded")
    assert [e.type for e in events if e.reason == "AmpSlowerThanFp32"] == ["Warning"]


def test_auto_where_bf16_pays_off_trains_in_bf16_without_the_condition(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    jobs.create("fast", auto_spec("ckpt", {"fp32": 0.3}))
    status = jobs.wait_phase("fast", ("Failed", "Succeeded"), 180)
    assert status["phase"] == "Succeeded", status
    assert status["attempts"][0]["precision"] == "bf16" == status["precision"]
    assert not any(c["type"] == "AmpSlowerThanFp32" for c in status["conditions"])


def test_the_quality_gate_ends_a_drifting_precision(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=60)
    spec["task"] = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "cancellationOffset": 1000}}
    spec["training"]["batchSize"] = 16
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    spec["validation"] = {"everySteps": 10, "maxLossDelta": 0.05}
    jobs.create("drifting", spec)
    status = jobs.wait_phase("drifting", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], second["precision"]) == ("bf16", "NumericFault", "fp32")
    assert first["message"].startswith("QualityDrift: ")


def test_an_auto_attempt_falls_back_in_place_from_what_it_measured(operator: Operator, jobs: Jobs) -> None:
    """fp32 made slow: the attempt measures bf16, drifts there, and goes on in fp32 in its own
    pod: its launch named the changes for each precision it might measure."""
    jobs.pvc("ckpt")
    spec = auto_spec("ckpt", {"fp32": 0.25})
    spec["task"]["args"]["cancellationOffset"] = 1000
    spec["training"].update(steps=30, batchSize=16)
    spec["validation"] = {"everySteps": 10, "maxLossDelta": 0.05}
    jobs.create("measured-drift", spec)
    status = jobs.wait_phase("measured-drift", ("Failed", "Succeeded"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], second["precision"]) == ("bf16", "NumericFault", "fp32"), status
    assert first["message"].startswith("QualityDrift: ") and set(first["measuredStepSeconds"]) == {"bf16", "fp32"}
    assert second["inPlace"] is True
    assert jobs.attempt_jobs("measured-drift") == ["measured-drift-a0"]  # the pod trained both attempts
