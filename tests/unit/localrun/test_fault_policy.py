"""spec.faultPolicy through `mpjob run`: a job's rule overrides the built-in action, in the
operator's planning (NumericFault, QualityDrift) and in the trainer (bad data, loss spikes)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.localrun.test_smarter_fallback import mlp, run

pytestmark = [pytest.mark.unit, pytest.mark.process]


def policy(*rules: tuple[str, str]) -> dict[str, Any]:
    return {"rules": [{"fault": fault, "action": action} for fault, action in rules]}


def failed_once(tmp_path: Any, **spec: Any) -> tuple[dict, dict]:
    code, report, out = run(tmp_path, **spec)
    assert code == 1 and report["phase"] == "Failed", out
    (only,) = report["attempts"]
    failed = next(c for c in report["conditions"] if c["type"] == "Failed")
    return only, failed


def test_an_fp16_overflow_with_numeric_fault_fail_ends_in_one_attempt_naming_the_rule(tmp_path: Any) -> None:
    only, failed = failed_once(
        tmp_path,
        task=mlp(overflowAtStep=15),
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]},
        faultPolicy=policy(("Preempted", "Fail"), ("NumericFault", "Fail")),
    )
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NumericFault", 42)
    named = "spec.faultPolicy.rules[1] (fault: NumericFault, action: Fail)"
    assert only["message"].startswith(named) and failed["reason"] == "NumericFault" and named in failed["message"]


def test_quality_drift_fail_stops_instead_of_falling_back(tmp_path: Any) -> None:
    only, failed = failed_once(
        tmp_path,
        task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "cancellationOffset": 1000}},
        training={"steps": 60, "batchSize": 16, "logEvery": 5},
        precision={"mode": "bf16"},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
        faultPolicy=policy(("QualityDrift", "Fail")),
    )
    assert (only["precision"], only["reason"]) == ("bf16", "NumericFault")
    assert "spec.faultPolicy.rules[0] (fault: QualityDrift, action: Fail)" in failed["message"]
    assert "QualityDrift:" in only["message"]


def test_bad_data_fail_ends_the_attempt_where_the_built_in_action_skips(tmp_path: Any) -> None:
    only, _ = failed_once(
        tmp_path,
        task=mlp(nonFiniteSamples=[5]),
        precision={"mode": "fp16"},
        faultPolicy=policy(("NonFiniteInFp32", "Fail")),
    )
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NonFiniteInFp32", 45)
    assert only.get("skipped") is None  # nothing quarantined: the rule said fail


def test_a_loss_spike_fail_ends_the_job_with_spike_detection_off_in_the_guard(tmp_path: Any) -> None:
    only, failed = failed_once(
        tmp_path,
        task=mlp(batchScale={"atStep": 25, "steps": 3}),
        training={"steps": 60, "batchSize": 8, "logEvery": 5},
        precision={"mode": "fp32", "guard": {"spike": {"window": 16}}},
        faultPolicy=policy(("LossSpike", "Fail")),
    )
    assert (only["precision"], only["reason"]) == ("fp32", "NumericFault")
    assert "LossSpike:" in only["message"] and "spec.faultPolicy.rules[0] (fault: LossSpike" in failed["message"]


@pytest.mark.parametrize(
    ("guard", "rule"),
    [({"maxConsecutiveOverflows": 2, "maxNonFiniteLosses": 1000}, "MaxConsecutiveOverflows"),
     ({"maxConsecutiveOverflows": 1000, "maxNonFiniteLosses": 2}, "MaxNonFiniteLosses")],
)  # fmt: skip
def test_a_rule_on_overflow_storms_fails_them_while_nan_losses_fall_back(tmp_path: Any, guard: dict, rule: str) -> None:
    """One fp16 fault, ended by whichever guard rule the guard's settings make trip first: the
    job's rule on MaxConsecutiveOverflows decides that one, NumericFault's (after it) the rest."""
    code, report, out = run(
        tmp_path,
        task=mlp(overflowAtStep=15),
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "guard": guard},
        faultPolicy=policy(("NumericFault", "FallBack"), ("MaxConsecutiveOverflows", "Fail")),
    )
    first = report["attempts"][0]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault") and f"{rule}:" in first["message"], out
    if rule == "MaxConsecutiveOverflows":
        assert code == 1 and report["phase"] == "Failed" and len(report["attempts"]) == 1, out
        failed = next(c for c in report["conditions"] if c["type"] == "Failed")
        assert "spec.faultPolicy.rules[1] (fault: MaxConsecutiveOverflows, action: Fail)" in failed["message"]
    else:
        assert code == 0 and report["phase"] == "Succeeded", out
        assert [a["precision"] for a in report["attempts"]] == ["fp16", "bf16"]
        assert "spec.faultPolicy" not in first["message"]  # the built-in's action, no rule named


#: The reverse of the rules above: an overflow storm falls back (in place, as planned), any other
#: numeric fault ends the job.
REVERSE = policy(("NumericFault", "Fail"), ("MaxConsecutiveOverflows", "FallBack"))
#: The guard settings that make the fp16 overflow end the attempt by the one rule or the other.
STORM = {"maxConsecutiveOverflows": 2, "maxNonFiniteLosses": 1000}
NAN_LOSSES = {"maxConsecutiveOverflows": 1000, "maxNonFiniteLosses": 2}


def test_the_reverse_policy_falls_back_in_place_from_an_overflow_storm(tmp_path: Any) -> None:
    code, report, out = run(
        tmp_path,
        task=mlp(overflowAtStep=15),
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "guard": STORM},
        faultPolicy=REVERSE,
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    first, second = report["attempts"]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault") and "MaxConsecutiveOverflows:" in (
        first["message"]
    ), out
    assert (second["precision"], second["reason"], second.get("inPlace")) == ("bf16", "Succeeded", True), out
    assert "spec.faultPolicy" not in first["message"]  # FallBack is the built-in action: no rule named


def test_the_reverse_policy_fails_nan_losses_naming_the_numeric_fault_rule(tmp_path: Any) -> None:
    only, failed = failed_once(
        tmp_path,
        task=mlp(overflowAtStep=15),
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "guard": NAN_LOSSES},
        faultPolicy=REVERSE,
    )
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NumericFault", 42)
    assert "MaxNonFiniteLosses:" in only["message"] and not only.get("inPlace")
    named = "spec.faultPolicy.rules[0] (fault: NumericFault, action: Fail)"
    assert only["message"].startswith(named) and failed["reason"] == "NumericFault" and named in failed["message"]
