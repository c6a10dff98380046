"""Fault rules that can never apply are named as warnings (mpjob_contract.spec_warnings): the job
is still valid (such jobs ran before and must keep running after an upgrade), `mpjob validate`
exits 0 and prints one line per dead rule naming spec.faultPolicy.rules[N] and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.cli import main
from mpjob_contract.spec import MixedPrecisionJobSpec
from mpjob_contract.spec_warnings import never_applying
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
