"""How `mpjob validate` and `mpjob run` read a manifest's YAML: as kubectl does (YAML 1.1 with
its booleans, numbers with an exponent), and what they say of what YAML made of a word: a
key or a value read as a boolean or a number, a string off its format (in words, not the
pattern)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from mpjob.validation import check_text
from mpjob_contract import formats
from tests.unit.operator.cases import bad
from tests.unit.operator.test_rules import crd_schema

pytestmark = pytest.mark.unit


HEAD = "apiVersion: mpjob.dev/v1alpha1\nkind: MixedPrecisionJob\nmetadata: {name: j}\nspec:\n  task: {builtin: gpt}\n"


@pytest.mark.parametrize(
    ("spec", "field", "needles"),
    [
        ("  faultPolicy: {rules: [{on: NumericFault, action: Fail}]}\n", "spec.faultPolicy.rules[0].true",
         ["read as a boolean", "quote it", "on is now fault"]),
        ("  precision: {guard: {spike: {action: off}}}\n", "spec.precision.guard.spike.action",
         ["got False", "unquoted on, off", "put the value in quotes"]),
        ("  resources: {minComputeCapability: 8.0}\n", "spec.resources.minComputeCapability",
         ['the number 8.0: put it in quotes, "8.0"']),
        ("  template: {nodeSelector: {gpu: yes}}\n", "spec.template.nodeSelector[gpu]",
         ["got a boolean", "unquoted on, off", "put the value in quotes"]),
        ("  template: {env: [{name: OMP_NUM_THREADS, value: 4}]}\n", "spec.template.env[0].value",
         ['the number 4: put it in quotes, "4"']),
    ],
    ids=["on-as-a-key", "off-as-a-value", "a-number-for-a-string", "yes-in-the-template", "a-number-in-the-template"],
)  # fmt: skip
def test_what_yaml_made_of_an_unquoted_word_is_said(spec: str, field: str, needles: list[str]) -> None:
    """YAML 1.1 (kubectl's reader too) takes on/off/yes/no as booleans and 8.0 as a number: the
    message names the field and says how to write it, in the template's pod fields too (an env
    value of 4 was "must be a string, got an integer", with neither the value nor the fix)."""
    jobs, problems = check_text(HEAD + spec)
    assert not jobs and [p.field for p in problems] == [field]
    assert all(needle in problems[0].message for needle in needles), problems[0].message


def test_numbers_with_an_exponent_are_numbers_as_kubectl_reads_them() -> None:
    """YAML 1.1 wants a dot and a signed exponent; kubectl does not, nor does mpjob (run, validate)."""
    task = "{module: my_pkg.train:make_task, args: {lr: 1e-3, steps: 3e5, s: '1e-3'}}"
    (job,), _ = check_text(HEAD.replace("{builtin: gpt}", task))
    assert job.spec.task.args == {"lr": 0.001, "steps": 300000.0, "s": "1e-3"}


def test_dates_are_strings_as_kubectl_reads_them() -> None:
    """kubectl's YAML reader keeps an unquoted date or time as the string written (YAML 1.1 makes it
    a timestamp): a label value `2024-05-01` was refused as "got date", and a task argument
    reached the trainers rewritten."""
    meta = "metadata: {name: j, labels: {release: 2024-05-01}, annotations: {at: 2001-12-14t21:59:43.10-05:00}}"
    text = HEAD.replace("metadata: {name: j}", meta).replace(
        "{builtin: gpt}", "{module: my_pkg.train:make_task, args: {since: 2024-05-01}}"
    )
    (job,), problems = check_text(text)
    assert problems == [] and job.metadata.labels == {"release": "2024-05-01"}
    assert job.metadata.annotations == {"at": "2001-12-14t21:59:43.10-05:00"}
    assert job.spec.task.args == {"since": "2024-05-01"}


def test_times_of_day_are_strings_as_kubectl_reads_them() -> None:
    """YAML 1.1's base-60 numbers (12:30 was 750, 1:30:00.5 was 5400.5) are no numbers to kubectl's reader."""
    meta = "metadata: {name: j, annotations: {window: 10:30}}"
    text = HEAD.replace("metadata: {name: j}", meta).replace(
        "{builtin: gpt}", "{module: my_pkg.train:make_task, args: {at: 12:30, t: 1:30:00.5}}"
    )
    (job,), problems = check_text(text)
    assert problems == [] and job.metadata.annotations == {"window": "10:30"}
    assert job.spec.task.args == {"at": "12:30", "t": "1:30:00.5"}


def test_an_equals_sign_is_a_string_as_kubectl_reads_it() -> None:
    """YAML 1.1's `=` (its value key) has no constructor: `sep: =` was a "YAML syntax error"."""
    (job,), problems = check_text(HEAD.replace("metadata: {name: j}", "metadata: {name: j, annotations: {sep: =}}"))
    assert problems == [] and job.metadata.annotations == {"sep": "="}


def test_an_argument_named_true_or_false_is_refused_naming_what_yaml_did() -> None:
    """What kubectl sends for an unquoted `n:` (a JSON manifest can say it too)."""
    (problem,) = check_text(json.dumps(bad("spec.task", {"builtin": "gpt", "args": {"false": 4, "lr": 0.1}})))[1]
    assert problem.field == "spec.task.args" and "names an argument false" in problem.message
    assert "quote the argument's name" in problem.message


def test_the_words_yaml_keeps_as_written_validate() -> None:
    rule = "  faultPolicy: {rules: [{fault: NumericFault, action: Fail}]}\n"
    (job,), problems = check_text(HEAD + rule + "  precision: {guard: {spike: {action: none}}}\n")
    assert problems == [] and job.spec.fault_policy.rules[0].named.value == "NumericFault"
    assert job.spec.precision.guard.spike.action == "none"


def patterns(node: Any) -> list[str]:
    """Every `pattern` in a schema, without recursion."""
    found, stack = [], [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += [node["pattern"]] if isinstance(node.get("pattern"), str) else []
            stack += list(node.values())
        elif isinstance(node, list):
            stack += node
    return found


def test_every_pattern_the_crd_checks_has_its_words() -> None:
    found = patterns(crd_schema()["properties"]["spec"])
    assert len(found) >= 10 and [p for p in found if formats.allowed_by(p) is None] == []


@pytest.mark.parametrize(
    ("path", "value", "fmt"),
    [
        ("spec.checkpoint.storage", {"s3": {"bucket": "My_Bucket", "endpoint": "http://s3:9000"}}, formats.BUCKET),
        ("spec.tracking", {"mlflow": {"uri": "http://m:5000", "credentialsSecret": "My_Secret"}}, formats.SECRET_NAME),
        ("spec.costPerGpuHour", {"amount": 2, "currency": "euro"}, formats.CURRENCY),
        ("spec.resources.requests", {"cpu": "four"}, formats.QUANTITY),
        ("spec.task", {"module": "my-pkg.train"}, formats.TASK_MODULE),
    ],
    ids=["bucket", "secret", "currency", "quantity", "module"],
)
def test_a_value_off_its_format_is_told_what_is_allowed_once(path: str, value: Any, fmt: formats.Format) -> None:
    """The words, not the pattern; a union (`int | Quantity`) says it once, as its last member."""
    (problem,) = check_text(yaml.safe_dump(bad(path, value)))[1]
    assert problem.message.startswith(f"must be {fmt.allows}, got '") and fmt.pattern not in problem.message


def test_a_key_written_twice_in_one_mapping_is_refused_naming_both_lines() -> None:
    """YAML keeps the last of two `training:` keys: `mpjob validate` said ok and `mpjob run` trained
    with the second's settings alone, where kubectl refuses the manifest."""
    text = HEAD + "  training: {steps: 80, batchSize: 32}\n  resources: {gpusPerWorker: 0}\n  training: {steps: 5}\n"
    jobs, problems = check_text(text)
    assert jobs == [] and [(p.field, p.message) for p in problems] == [
        (
            "spec.training",
            "YAML refused at line 8: training is written twice in this mapping (first at line 6); keep one",
        )
    ]


def test_the_same_key_in_two_mappings_is_no_repeat() -> None:
    text = HEAD + "  checkpoint: {everySteps: 4}\n  validation: {everySteps: 4}\n"  # everySteps in two mappings
    jobs, problems = check_text(text)
    assert problems == [] and len(jobs) == 1


def test_a_tab_in_the_indentation_is_named_with_the_fix() -> None:
    _, problems = check_text(HEAD + "\ttraining: {steps: 8}\n")
    assert [p.message for p in problems] == [
        "YAML syntax error at line 6, column 1: found character '\\t' that cannot start any token "
        "(YAML indents with spaces only: replace the tab with spaces)"
    ]
