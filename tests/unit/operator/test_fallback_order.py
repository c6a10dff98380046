"""spec.precision.fallback only climbs the ladder fp8 < fp16 < bf16 < fp32: each entry safer than
the mode and than the one before it. A list that goes down (fp32 -> fp16) or repeats the mode
(which the ladder would drop silently) is refused, naming the entry; an unset list is the rungs
of [bf16, fp32] above the mode, and an `auto` job's measured precision keeps only those above it."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpjob.planning.classify import AttemptOutcome, classify
from mpjob.planning.planner import Finish, StartAttempt, after_attempt, ladder, walked
from mpjob.validation import check_text
from mpjob_contract import rules
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec

pytestmark = pytest.mark.unit


def manifest(precision: dict[str, Any]) -> str:
    spec = {"task": {"builtin": "mlp"}, "precision": precision}
    return yaml.safe_dump(
        {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "j"}, "spec": spec}
    )


def spec(**precision: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate(
        {
            "task": {"builtin": "mlp"},
            "precision": precision,
            "resources": {"gpusPerWorker": 1, "minComputeCapability": "7.0"},
        }
    )


@pytest.mark.parametrize(
    ("precision", "field"),
    [
        ({"mode": "fp32", "fallback": ["fp16"]}, "spec.precision.fallback[0]"),  # down from fp32
        ({"mode": "fp32", "fallback": ["bf16", "fp32"]}, "spec.precision.fallback[0]"),
        ({"mode": "bf16", "fallback": ["bf16"]}, "spec.precision.fallback[0]"),  # the mode again
        ({"mode": "bf16", "fallback": ["fp32", "bf16"]}, "spec.precision.fallback[1]"),
        ({"mode": "fp16", "fallback": ["fp32", "bf16"]}, "spec.precision.fallback[1]"),  # out of order
        ({"mode": "fp16", "fallback": ["bf16", "fp16"]}, "spec.precision.fallback[1]"),
        ({"mode": "fp16", "fallback": ["fp16", "bf16"]}, "spec.precision.fallback[0]"),
        ({"mode": "fp8", "fallback": ["fp32", "bf16"]}, "spec.precision.fallback[1]"),
        ({"mode": "auto", "fallback": ["bf16", "fp16"]}, "spec.precision.fallback[1]"),
        ({"fallback": ["fp32", "fp16"]}, "spec.precision.fallback[1]"),  # mode unset: auto
    ],
)
def test_a_fallback_that_does_not_climb_is_refused_naming_the_entry(precision: dict[str, Any], field: str) -> None:
    _, problems = check_text(manifest(precision))
    assert [(p.field, p.message) for p in problems] == [(field, rules.FALLBACK_SAFER_IN_ORDER.message)]
    assert "fp8 < fp16 < bf16 < fp32" in problems[0].message and "fp32: []" in problems[0].message


@pytest.mark.parametrize(
    ("precision", "steps"),
    [
        ({"mode": "fp16", "fallback": ["bf16", "fp32"]}, ["fp16", "bf16", "fp32"]),
        ({"mode": "fp16", "fallback": ["fp32"]}, ["fp16", "fp32"]),
        ({"mode": "bf16", "fallback": ["fp32"]}, ["bf16", "fp32"]),
        ({"mode": "fp32", "fallback": []}, ["fp32"]),
        ({"mode": "fp8", "fallback": ["fp16", "bf16", "fp32"]}, ["fp8", "fp16", "bf16", "fp32"]),
        ({"mode": "auto", "fallback": ["fp16", "fp32"]}, ["fp16", "fp32"]),  # cc 7.0: auto -> fp16
    ],
)
def test_a_climbing_fallback_is_the_ladder(precision: dict[str, Any], steps: list[str]) -> None:
    assert check_text(manifest(precision))[1] == []
    assert ladder(spec(**precision)) == steps


@pytest.mark.parametrize(
    ("mode", "fallback"),
    [
        ("auto", ["bf16", "fp32"]),
        ("fp8", ["bf16", "fp32"]),
        ("fp16", ["bf16", "fp32"]),
        ("bf16", ["fp32"]),
        ("fp32", []),
    ],
)
def test_an_unset_fallback_is_the_default_rungs_above_the_mode(mode: str, fallback: list[str]) -> None:
    assert spec(mode=mode).precision.fallback == fallback
    assert check_text(manifest({"mode": mode}))[1] == []


def test_an_fp32_job_fails_a_numeric_fault_rather_than_falling_back_to_a_less_safe_precision() -> None:
    s = spec(mode="fp32")  # the ladder once went fp32 -> bf16 here
    assert ladder(s) == ["fp32"]
    end = after_attempt(s, 0, "fp32", classify(AttemptOutcome(42)), 10, None)
    assert isinstance(end, Finish) and not end.succeeded and "no precision is left" in end.message


def test_an_auto_job_that_measured_fp32_keeps_only_the_rungs_above_it() -> None:
    s = spec(mode="auto", fallback=["bf16"])  # the capability's ladder: fp16, bf16
    history = [AttemptStatus(index=0, precision="fp32", reason="NumericFault")]
    assert walked(s, history) == ["fp32"]  # never fp32 -> bf16
    end = after_attempt(s, 0, "fp32", classify(AttemptOutcome(42)), 10, None, history=history)
    assert isinstance(end, Finish) and not end.succeeded


def test_an_auto_job_that_measured_bf16_skips_the_less_safe_fp16_rung() -> None:
    s = spec(mode="auto", fallback=["fp16", "bf16", "fp32"])
    history = [AttemptStatus(index=0, precision="bf16", reason="NumericFault")]
    assert walked(s, history) == ["bf16", "fp32"]
    down = after_attempt(s, 0, "bf16", classify(AttemptOutcome(42)), 10, None, history=history)
    assert isinstance(down, StartAttempt) and (down.precision, down.fallback_from) == ("fp32", "bf16")
