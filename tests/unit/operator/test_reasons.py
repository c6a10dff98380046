"""Every reason is an enum member: a job's finish, an attempt's ending, a condition's or an
Event's reason is written from one enum (mpjob_contract.codes' Reason and FinishReason,
planning.status' ConditionReason and ConditionType, planning.classify's ApiReason), never as a
bare string beside them, so a misspelt reason fails where it is written."""

from __future__ import annotations

import ast
from enum import StrEnum
from pathlib import Path

import pytest

from mpjob.planning.classify import API_ERROR_POLICY, NAME_CONFLICT, UNAVAILABLE, Action, Classification
from mpjob.planning.planner import Finish, after_attempt
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.codes import FinishReason, Reason

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[3] / "operator" / "mpjob"
#: Calls whose reason argument (by position, or `reason=`) must not be a string literal.
REASON_AT = {"Finish": 1, "Event": 1, "ApiRule": 2, "condition": 4, "set_condition": 3, "end_attempt": 2}


def _bare_reasons() -> list[str]:
    found = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in REASON_AT:
                continue
            args = [
                *node.args[REASON_AT[name] : REASON_AT[name] + 1],
                *(k.value for k in node.keywords if k.arg == "reason"),
            ]
            if any(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_reason_is_written_as_a_bare_string() -> None:
    assert _bare_reasons() == []


def test_the_planners_finishes_and_the_api_policy_name_enum_members() -> None:
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "mlp"}, "precision": {"mode": "fp32", "fallback": []}, "runPolicy": {"maxAttempts": 1}}
    )
    fault = Classification(Reason.NUMERIC_FAULT, Action.NEXT_PRECISION, "nan")
    exhausted = after_attempt(spec, 0, "fp32", fault, 0, None)
    assert isinstance(exhausted, Finish) and exhausted.reason is FinishReason.ATTEMPTS_EXHAUSTED
    spec.run_policy.max_attempts = 3
    left = after_attempt(spec, 0, "fp32", fault, 0, None)
    assert isinstance(left, Finish) and left.reason is FinishReason.NO_PRECISION_LEFT
    assert all(isinstance(rule.reason, StrEnum) for rule in (*API_ERROR_POLICY, NAME_CONFLICT, UNAVAILABLE))
