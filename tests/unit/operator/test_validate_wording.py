"""`mpjob validate`'s words for the mistakes a newcomer makes first: a misspelt field gets the
allowed name closest to it (or the short list of what is allowed there), a number out of range
names the value given and the whole range, and a missing apiVersion or kind says so and what it
must be."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpjob.validation import check_text
from tests.unit.operator.cases import GOOD, bad

pytestmark = pytest.mark.unit


def said(doc: dict[str, Any]) -> dict[str, str]:
    """Each problem's field -> its message."""
    _, problems = check_text(yaml.safe_dump(doc))
    return {p.field: p.message for p in problems}


@pytest.mark.parametrize(
    ("where", "value", "field", "suggested"),
    [
        ("spec.training", {"batchsize": 8}, "spec.training.batchsize", "did you mean batchSize?"),
        ("spec.resources", {"gpuPerWorker": 1}, "spec.resources.gpuPerWorker", "did you mean gpusPerWorker?"),
        ("spec", {"task": {"builtin": "mlp"}, "precison": {}}, "spec.precison", "did you mean precision?"),
        ("metadata", {"name": "x", "nmae": "y"}, "metadata.nmae", "did you mean name?"),
    ],
)
def test_a_misspelt_field_is_told_the_closest_allowed_name(
    where: str, value: dict[str, Any], field: str, suggested: str
) -> None:
    message = said(bad(where, value))[field]
    assert message.startswith("unknown field") and suggested in message, message


def test_a_field_unlike_any_lists_what_is_allowed_there() -> None:
    message = said(bad("spec.training", {"zzz": 1}))["spec.training.zzz"]
    assert "allowed here: steps, batchSize, gradAccumulation, learningRate" in message, message
    assert "did you mean" not in message


@pytest.mark.parametrize(
    ("where", "value", "field", "words"),
    [
        ("spec.training", {"steps": -5}, "spec.training.steps", "must be from 1 to 100000000, got -5"),
        ("spec", {"task": {"builtin": "mlp"}, "workers": 0}, "spec.workers", "must be from 1 to 256, got 0"),
        (
            "spec.training",
            {"learningRate": 0},
            "spec.training.learningRate",
            "must be greater than 0 and at most 10, got 0",
        ),
    ],
)
def test_a_number_out_of_range_names_the_value_and_the_range(
    where: str, value: dict[str, Any], field: str, words: str
) -> None:
    assert said(bad(where, value))[field] == words


@pytest.mark.parametrize("field", ["apiVersion", "kind"])
def test_a_missing_api_version_or_kind_says_missing_and_what_to_write(field: str) -> None:
    doc = {k: v for k, v in GOOD.items() if k != field}
    wanted = GOOD[field]
    assert said(doc)[field] == f"missing; it must be {wanted} (write `{field}: {wanted}` at the top of the document)"


def test_a_wrong_api_version_names_what_was_given() -> None:
    assert said(dict(GOOD, apiVersion="mpjob.dev/v1"))["apiVersion"] == "must be mpjob.dev/v1alpha1, got 'mpjob.dev/v1'"


@pytest.mark.parametrize(
    ("where", "value", "field", "words"),
    [
        (
            "spec.task",
            {"command": "python train.py"},
            "spec.task.command",
            "must be a list ([a, b], or one `- item` per line), got 'python train.py'",
        ),
        (
            "spec",
            {"task": {"builtin": "gpt"}, "precision": "fp16"},
            "spec.precision",
            "must be a mapping of its fields (mode, fallback, fp8, keepFp32, tf32, fallbackKeepsBatch, "
            "repromoteAfterSteps, maxRepromotions, inPlace, lossScale, guard), got 'fp16'",
        ),
        (
            "spec.task",
            {"builtin": "gpt", "args": "--overflow-at 45"},
            "spec.task.args",
            "must be a mapping (`name: value` lines indented below it, or {name: value}), got '--overflow-at 45'",
        ),
        ("spec.task", {"command": ["python", 45]}, "spec.task.command[1]", "must be a string, got 45"),
    ],
)
def test_a_value_of_the_wrong_shape_says_what_the_field_takes(
    where: str, value: dict[str, Any], field: str, words: str
) -> None:
    assert said(bad(where, value))[field].startswith(words)


def test_a_bad_precision_mode_is_the_one_problem_told_not_a_fallback_it_leaves_unmade() -> None:
    """The fallback ladder's default comes from the mode: a bad mode leaves it unmade, which is no
    mistake of the manifest's and was told as pydantic's 'default factory' words on spec.precision.fallback."""
    assert said(bad("spec.precision", {"mode": "bf61"})) == {
        "spec.precision.mode": "must be one of 'auto', 'fp8', 'fp16', 'bf16' or 'fp32', got 'bf61'"
    }
