"""The CRD's transition rules that keep what a job's checkpoints bind (mpjob_contract.binding):
one for each bound setting, at its node, naming its field and the ways on, on nothing else (the
world size and every other field stay editable). tests/integration/operator/test_spec_edits.py
shows the API server refusing and taking the edits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob_contract import binding
from tests.unit.operator.test_rules import crd_schema, validations_below

pytestmark = pytest.mark.unit

WAYS_ON = "delete the job and create it again, or create a job under a new name"


def _transition_rules() -> dict[str, list[dict[str, str]]]:
    """The CRD's rules that read `oldSelf`, by schema path."""
    found = {
        path: [r for r in rs if "oldSelf" in r["rule"]] for path, rs in validations_below(crd_schema(), "").items()
    }
    return {path: rs for path, rs in found.items() if rs}


def test_each_bound_setting_has_its_transition_rule_and_nothing_else_has_one() -> None:
    assert set(binding.UNCHANGED) == set(binding.FIELDS)
    expected: dict[str, list[dict[str, str]]] = {}
    for rule in binding.UNCHANGED.values():
        expected.setdefault(rule.path, []).append(rule.x_kubernetes_validation())
    assert _transition_rules() == expected
    assert set(expected) == {"spec.task", "spec.training"}  # workers, processesPerWorker: not bound


def test_the_task_is_compared_whole_as_the_server_stores_it() -> None:
    """task.args is free-form: one equality of the whole task, no walk of its values."""
    assert binding.UNCHANGED["task"].cel == "self == oldSelf"


@pytest.mark.parametrize("setting", sorted(binding.FIELDS))
def test_each_rule_names_its_fields_and_the_ways_on(setting: str) -> None:
    rule = binding.UNCHANGED[setting]
    for field in binding.FIELDS[setting].split(" x "):
        assert field in rule.message
    assert rule.message.endswith(WAYS_ON)


def test_the_samples_per_step_rule_compares_the_product_not_each_factor() -> None:
    """A re-split by hand (batchSize 4 x 1 to 2 x 2) keeps the samples per step: it may be made."""
    cel = binding.UNCHANGED["samplesPerStep"].cel
    assert cel.count("*") == 2 and cel.count("==") == 1
    left, right = cel.split(" == ")
    assert left.replace("self.", "oldSelf.") == right


def _training_schema() -> dict[str, Any]:
    node: dict[str, Any] = crd_schema()["properties"]["spec"]["properties"]["training"]
    return node


@pytest.mark.parametrize(("field", "default"), [("seed", 0), ("batchSize", 16), ("gradAccumulation", 1)])
def test_an_unset_training_field_reads_as_its_schema_default(field: str, default: int) -> None:
    """The API server checks the rules against training's default ({}) before its fields' defaults
    fill it (it refused the CRD when the rules read the fields bare): each rule reads an unset field
    as the default the schema gives it."""
    training = _training_schema()
    assert training["default"] == {} and training["properties"][field]["default"] == default
    rules = [r["rule"] for r in training["x-kubernetes-validations"]]
    for side in ("self", "oldSelf"):
        assert any(f"(has({side}.{field}) ? {side}.{field} : {default})" in rule for rule in rules), field


def test_the_docs_quote_the_seed_rule_s_message_as_the_api_server_says_it() -> None:
    sdk = " ".join((Path(__file__).resolve().parents[3] / "docs" / "sdk.md").read_text().split())
    assert f'spec.training.seed: Invalid value: "object": {binding.UNCHANGED["seed"].message}' in sdk
