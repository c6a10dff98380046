"""Every number of the spec has a largest value, in the models and so in the CRD: a step count no
larger than training.steps' bound, seconds no longer than a year, a loss scale or a norm no larger
than any that means something. `1000000000000000000000` (past int64) is refused naming its field,
by `mpjob validate` and by the CRD's `maximum` alike."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from mpjob.crd import crd_yaml
from mpjob.validation import check_text
from mpjob_contract.api import MAX_STEPS, MixedPrecisionJobSpec
from tests.unit.operator.cases import bad

pytestmark = pytest.mark.unit

HUGE = 10**21

#: Each field that once took any number, and the largest it takes now.
BOUNDED = {
    "spec.training.warmupSteps": MAX_STEPS,
    "spec.training.logEvery": MAX_STEPS,
    "spec.training.gradClipNorm": 1_000_000.0,
    "spec.precision.repromoteAfterSteps": MAX_STEPS,
    "spec.precision.lossScale.init": 2.0**32,
    "spec.precision.lossScale.growthFactor": 1000,
    "spec.precision.lossScale.growthInterval": MAX_STEPS,
    "spec.precision.guard.maxConsecutiveOverflows": MAX_STEPS,
    "spec.precision.guard.minLossScale": 2.0**32,
    "spec.precision.guard.maxNonFiniteLosses": MAX_STEPS,
    "spec.precision.guard.stagnationSteps": MAX_STEPS,
    "spec.checkpoint.everySteps": MAX_STEPS,
    "spec.validation.everySteps": MAX_STEPS,
    "spec.runPolicy.activeDeadlineSeconds": 365 * 24 * 3600,
    "spec.runPolicy.ttlSecondsAfterFinished": 365 * 24 * 3600,
    "spec.runPolicy.podCreationTimeoutSeconds": 7 * 24 * 3600,
}


def _problems(path: str, value: Any) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in check_text(yaml.safe_dump(bad(path, value)))[1]]


@pytest.mark.parametrize("path", BOUNDED)
def test_a_number_past_int64_is_refused_naming_its_field(path: str) -> None:
    problems = _problems(path, HUGE)
    assert [field for field, _ in problems] == [path], problems


@pytest.mark.parametrize(("path", "largest"), BOUNDED.items())
def test_the_largest_value_is_taken_and_one_more_is_refused(path: str, largest: float) -> None:
    assert _problems(path, largest) == []
    above = largest + 1 if isinstance(largest, int) else largest * 2
    assert [field for field, _ in _problems(path, above)] == [path]


@pytest.mark.parametrize(("path", "largest"), BOUNDED.items())
def test_the_crd_carries_each_maximum(path: str, largest: float) -> None:
    node = yaml.safe_load(crd_yaml())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in path.split("."):
        node = node["properties"][part]
    assert node["maximum"] == largest and not node.get("exclusiveMaximum")


def _unbounded(model: type[BaseModel], at: str) -> list[str]:
    found = []
    for name, field in model.model_fields.items():
        path = f"{at}.{field.alias or name}"
        inner = [a for a in (getattr(field.annotation, "__args__", None) or (field.annotation,)) if a is not type(None)]
        for kind in inner:
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += _unbounded(kind, path)
            elif kind in (int, float) and not any(
                getattr(m, "le", None) or getattr(m, "lt", None) for m in field.metadata
            ):
                found.append(path)
    return found


def test_no_number_of_the_spec_is_left_without_a_maximum() -> None:
    assert _unbounded(MixedPrecisionJobSpec, "spec") == []
