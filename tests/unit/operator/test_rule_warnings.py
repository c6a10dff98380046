"""Fault rules that can never apply are named as warnings (mpjob_contract.spec_warnings): the job
is still valid (such jobs ran before and must keep running after an upgrade), `mpjob validate`
exits 0 and prints one line per dead rule naming spec.faultPolicy.rules[N] and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob_contract.rule_warnings import never_applying
from mpjob_contract.spec import MixedPrecisionJobSpec
from tests.unit.operator.cases import GOOD

pytestmark = pytest.mark.unit


def spec(**fields: Any) -> MixedPrecisionJobSpec:
    return MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, **fields}, by_alias=True)


def rules(*given: dict[str, str]) -> dict[str, Any]:
    return {"faultPolicy": {"rules": list(given)}}


@pytest.mark.parametrize(
    "second", [{"fault": "NumericFault", "action": "Fail"}, {"on": "NumericFault", "action": "Retry"}]
)
def test_a_second_rule_on_the_same_fault_never_applies(second: dict[str, str]) -> None:
    found = never_applying(spec(**rules({"fault": "NumericFault", "action": "FallBack"}, second)))
    assert found == [("faultPolicy.rules[1]", "never applies: rules[0] is on NumericFault too and comes first")]


def test_a_quality_drift_rule_needs_the_quality_gate() -> None:
    drift = rules({"fault": "QualityDrift", "action": "Fail"})
    (found,) = never_applying(spec(**drift))
    assert found[0] == "faultPolicy.rules[0]" and "spec.validation.everySteps is 0" in found[1]
    assert never_applying(spec(**drift, validation={"everySteps": 50})) == []


def test_a_fall_back_from_fp32_has_no_rung_below() -> None:
    fall = rules({"fault": "LossSpike", "action": "FallBack"})
    (found,) = never_applying(spec(**fall, precision={"mode": "fp32"}))
    assert found[0] == "faultPolicy.rules[0]" and "precision.mode fp32 has none" in found[1]
    assert never_applying(spec(**fall, precision={"mode": "fp16"})) == []


def test_rules_on_distinct_faults_say_nothing() -> None:
    given = rules({"fault": "NumericFault", "action": "Fail"}, {"fault": "LossSpike", "action": "RollBack"})
    assert never_applying(spec(**given)) == []


def test_validate_prints_the_warning_and_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {
        **GOOD,
        "spec": {
            **GOOD["spec"],
            **rules({"fault": "NumericFault", "action": "Fail"}, {"on": "NumericFault", "action": "FallBack"}),
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: warning: spec.faultPolicy.rules[1]: never applies: rules[0] is on NumericFault too and comes first",
        f"{path}: ok (1 MixedPrecisionJob)",
    ]


#: A rule on each of the four guard rules NumericFault covers (faults.COVERED_BY).
ALL_FOUR = (
    {"fault": "MaxNonFiniteLosses", "action": "Retry"},
    {"fault": "MaxConsecutiveOverflows", "action": "Fail"},
    {"fault": "LossScaleCollapsed", "action": "Fail"},
    {"fault": "Stagnation", "action": "Retry"},
)
CAUGHT = (
    "rules[0] (MaxNonFiniteLosses), rules[1] (MaxConsecutiveOverflows), rules[2] (LossScaleCollapsed), "
    "rules[3] (Stagnation)"
)


def test_a_numeric_fault_rule_after_rules_on_all_four_guard_rules_never_applies() -> None:
    given = spec(
        **rules(*ALL_FOUR, {"fault": "NumericFault", "action": "Fail"}),
        precision={"mode": "fp16", "guard": {"stagnationSteps": 50}},
    )
    assert never_applying(given) == [
        (
            "faultPolicy.rules[4]",
            "never applies: NumericFault decides only a guard rule no rule names, and "
            f"{CAUGHT} name all four it covers",
        )
    ]


def test_a_numeric_fault_rule_first_is_beaten_by_the_four_all_the_same() -> None:
    """faults.decide takes the rule on the guard rule itself in either order."""
    first = [{"fault": "NumericFault", "action": "Retry"}, *ALL_FOUR]
    found = never_applying(spec(**rules(*first), precision={"mode": "fp16", "guard": {"stagnationSteps": 50}}))
    assert [field for field, _ in found] == ["faultPolicy.rules[0]"]
    assert "rules[1] (MaxNonFiniteLosses)" in found[0][1] and "rules[4] (Stagnation)" in found[0][1]


def test_a_numeric_fault_rule_left_one_guard_rule_that_can_fire_still_applies() -> None:
    three = [*ALL_FOUR[:3], {"fault": "NumericFault", "action": "Fail"}]
    assert never_applying(spec(**rules(*three), precision={"mode": "fp16", "guard": {"stagnationSteps": 50}})) == []


NUMERIC = {"fault": "NumericFault", "action": "Fail"}
NO_FP16 = "no attempt trains fp16: precision.mode is bf16 and precision.fallback is [fp32]"
OFF = "precision.guard.stagnationSteps is 0 (off)"


def test_a_numeric_fault_rule_on_a_bf16_job_without_stagnation_covers_only_max_non_finite_losses() -> None:
    """The loss-scale rules need an fp16 rung and Stagnation a check that is on: a rule on
    MaxNonFiniteLosses leaves NumericFault nothing it could ever decide."""
    given = spec(**rules(ALL_FOUR[0], NUMERIC), precision={"mode": "bf16"})
    assert never_applying(given) == [
        (
            "faultPolicy.rules[1]",
            "never applies: NumericFault decides only a guard rule no rule names, and MaxConsecutiveOverflows and "
            f"LossScaleCollapsed never fire ({NO_FP16}); Stagnation never fires ({OFF}); "
            "rules[0] (MaxNonFiniteLosses) names the rest",
        )
    ]


def test_a_numeric_fault_rule_whose_loss_scale_rules_are_named_and_stagnation_cannot_fire_never_applies() -> None:
    """A stagnation check longer than the run is as dead as one that is off."""
    given = spec(
        **rules(*ALL_FOUR[:3], NUMERIC),
        training={"steps": 300},
        precision={"mode": "fp16", "guard": {"stagnationSteps": 300}},
    )
    ((field, why),) = never_applying(given)
    assert field == "faultPolicy.rules[3]"
    assert why.endswith(
        "Stagnation never fires (precision.guard.stagnationSteps=300 is not below training.steps=300: no loss "
        "stays stuck that many steps in the run, the check never ends a precision); rules[0] (MaxNonFiniteLosses), "
        "rules[1] (MaxConsecutiveOverflows), rules[2] (LossScaleCollapsed) name the rest"
    )


def test_a_numeric_fault_rule_with_stagnation_named_and_no_fp16_never_applies() -> None:
    given = spec(
        **rules(NUMERIC, ALL_FOUR[0], ALL_FOUR[3]), precision={"mode": "bf16", "guard": {"stagnationSteps": 50}}
    )
    ((field, why),) = never_applying(given)
    assert field == "faultPolicy.rules[0]"
    assert why.endswith(
        f"MaxConsecutiveOverflows and LossScaleCollapsed never fire ({NO_FP16}); "
        "rules[1] (MaxNonFiniteLosses), rules[2] (Stagnation) name the rest"
    )


@pytest.mark.parametrize(
    ("named", "precision"),
    [
        # MaxNonFiniteLosses unnamed: it always can fire (guard.maxNonFiniteLosses >= 1)
        ((), {"mode": "bf16"}),
        ((ALL_FOUR[1], ALL_FOUR[2], ALL_FOUR[3]), {"mode": "bf16"}),
        # Stagnation can fire
        ((ALL_FOUR[0],), {"mode": "bf16", "guard": {"stagnationSteps": 50}}),
        # a loss-scale rule can fire: an fp16 rung, or auto (fp16 on some nodes)
        ((ALL_FOUR[0], ALL_FOUR[3]), {"mode": "fp16"}),
        ((ALL_FOUR[0], ALL_FOUR[3]), {"mode": "fp8", "fallback": ["fp16", "fp32"]}),
        ((ALL_FOUR[0], ALL_FOUR[3]), {"mode": "auto"}),
        ((ALL_FOUR[0], ALL_FOUR[1], ALL_FOUR[3]), {"mode": "fp16"}),  # LossScaleCollapsed is left
    ],
)
def test_a_numeric_fault_rule_with_a_guard_rule_left_that_can_fire_says_nothing(
    named: tuple[dict[str, str], ...], precision: dict[str, Any]
) -> None:
    """Other rules may be dead of their own (a loss-scale rule on bf16); the NumericFault rule is not."""
    found = never_applying(spec(**rules(*named, NUMERIC), precision=precision))
    assert f"faultPolicy.rules[{len(named)}]" not in [field for field, _ in found]
