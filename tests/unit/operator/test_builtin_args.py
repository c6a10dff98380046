"""A builtin task's args are checked where the spec is (`mpjob validate`, `mpjob run`, the
operator) by the functions the trainer builds the workload with: what would end a job a
ConfigError at start is refused first, naming spec.task.args.<field> and what is allowed, and
what the trainer takes passes."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpjob.validation import check_text
from mpjob_contract import builtin_args
from tests.unit.operator.cases import bad, with_args

pytestmark = pytest.mark.unit


def said(task: dict[str, Any]) -> list[str]:
    return [str(p) for p in check_text(yaml.safe_dump(bad("spec.task", task)), "job.yaml")[1]]


def test_a_step_delay_without_its_precision_is_refused_naming_the_field_and_the_form() -> None:
    assert said({"builtin": "mlp", "args": {"stepDelay": 0.05}}) == [
        "job.yaml: spec.task.args.stepDelay: expected {fp32|bf16|fp16: seconds between 0 and 60}, got 0.05"
    ]


@pytest.mark.parametrize(
    ("builtin", "args", "field"),
    [
        ("gpt", {"stepDelay": {"fp8": 0.1}}, "stepDelay"),
        ("gpt", {"vocabSize": 100}, "vocabSize"),
        ("gpt", {"nEmbd": 30, "nHead": 4}, "nEmbd"),
        ("gpt", {"data": "books"}, "data"),
        ("gpt", {"samples": 10}, "samples"),
        ("gpt", {"nLayer": "deep"}, "nLayer"),
        ("gpt", {"nLayer": 2.7}, "nLayer"),
        ("gpt", {"nHead": True}, "nHead"),
        ("gpt", {"dropout": True}, "dropout"),
        ("gpt", {"data": "random", "samples": 64.5}, "samples"),
        ("gpt", {"dropout": 1.5}, "dropout"),
        ("gpt", {"dropout": -0.1}, "dropout"),
        ("gpt", {"corpusBytes": 10}, "corpusBytes"),
        ("gpt", {"blockSize": 300_000}, "corpusBytes"),
        ("mlp", {"nonFiniteSamples": [5000]}, "nonFiniteSamples"),
        ("mlp", {"samples": 8, "nonFiniteSamples": [8]}, "nonFiniteSamples"),
        ("mlp", {"batchScale": {"atStep": "x"}}, "batchScale"),
        ("mlp", {"overflowAtStep": "soon"}, "overflowAtStep"),
        ("mlp", {"overflowAtStep": False}, "overflowAtStep"),
        ("mlp", {"batchScale": {"atStep": True}}, "batchScale"),
        ("mlp", {"stepDelay": {"fp16": True}}, "stepDelay"),
        ("mlp", {"nonFiniteSamples": [True]}, "nonFiniteSamples"),
        ("mlp", {"hidden": 0}, ""),
        ("mlp", {"nLayer": 2}, ""),
        ("mlp", {"layers": 1, "fp8OutlierAtStep": 5}, "fp8OutlierAtStep"),
    ],
)
def test_a_bad_builtin_argument_is_refused_with_the_words_the_trainer_ends_it_with(
    builtin: str, args: dict[str, Any], field: str
) -> None:
    with pytest.raises(builtin_args.BadTaskArg) as trainer_reads:
        builtin_args.check(builtin, args)
    where = "spec.task.args" + (f".{field}" if field else "")
    assert said({"builtin": builtin, "args": args}) == [f"job.yaml: {where}: {trainer_reads.value.why}"]


@pytest.mark.parametrize(
    ("args", "why"),
    [
        ({"nLayer": 2.7}, "nLayer: expected int, got 2.7"),
        ({"nLayer": True}, "nLayer: expected int, got True"),
        ({"dropout": False}, "dropout: expected float, got False"),
    ],
)
def test_a_fraction_or_a_boolean_is_no_integer_argument_and_is_told_not_truncated(
    args: dict[str, Any], why: str
) -> None:
    """int() would train 2 layers for 2.7 and 1 for true (YAML's unquoted yes or on): a typo the
    job would never tell; a whole number written 16.0 is an integer, as the API server takes it."""
    assert said({"builtin": "gpt", "args": args}) == [f"job.yaml: spec.task.args.{why}"]


@pytest.mark.parametrize(
    ("builtin", "args"),
    [
        ("mlp", {"stepDelay": {"bf16": 0.05, "fp32": 0}, "nonFiniteSamples": "all", "batchScale": {"atStep": 3}}),
        ("mlp", {"samples": "64", "hidden": 16.0, "overflowGain": 1e4, "cancellationOffset": 1000}),
        ("mlp", {"layers": 2, "fp8OutlierAtStep": 5, "fp8OutlierUntilStep": 9}),
        ("gpt", {"nLayer": 1, "nHead": 2, "nEmbd": 16, "data": "random", "samples": 30, "vocabSize": 50304}),
        ("gpt", {"corpusBytes": 5000, "dropout": 0.1, "stepDelay": {"fp16": 60}}),
        ("gpt", {"nLayer": 2.0, "nHead": "2", "dropout": 0, "overflowAtStep": 3.0}),
    ],
)
def test_arguments_the_trainer_takes_pass(builtin: str, args: dict[str, Any]) -> None:
    assert said({"builtin": builtin, "args": args}) == []


def test_a_factory_keeps_its_free_form_args() -> None:
    """Only the builtins' args are known: a factory's (task.module) are its own."""
    assert check_text(yaml.safe_dump(with_args({"stepDelay": 0.05, "anything": [1]})))[1] == []


def test_a_misspelt_argument_is_told_the_closest_one_as_a_misspelt_field_is() -> None:
    [message] = said({"builtin": "mlp", "args": {"hiden": 16, "zzz": 1}})
    assert message.startswith(
        "job.yaml: spec.task.args: unknown argument(s) hiden, zzz for builtin mlp "
        "(hiden: did you mean hidden?); allowed: batchScale, "
    ), message
