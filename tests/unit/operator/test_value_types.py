"""`mpjob validate` holds a manifest's values to the CRD's types, as the API server does: a value
YAML quoted, or read as a boolean, is refused where the models alone would have converted it,
and a number JSON cannot carry (YAML's .inf, .nan) is named before kubectl fails on it."""

from __future__ import annotations

import time

import pytest
import yaml

from mpjob.validation import check_text
from tests.unit.operator.cases import bad, with_args

pytestmark = pytest.mark.unit


def said(doc: dict) -> list[str]:
    return [str(p) for p in check_text(yaml.safe_dump(doc), "job.yaml")[1]]


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("spec.workers", "2", "must be an integer, got '2' (write it without quotes)"),
        ("spec.workers", "two", "must be an integer, got 'two'"),
        ("spec.precision.guard.replaySteps", True, "must be an integer, got True (YAML reads an unquoted on, "),
        ("spec.training.learningRate", "0.001", "must be a number, got '0.001' (write it without quotes)"),
        ("spec.precision.inPlace", "false", "must be a boolean (true or false), got 'false' (write it without"),
        ("spec.runPolicy.suspend", "no", "must be a boolean (true or false), got 'no'"),
        ("spec.resources.limits", {"memory": False}, "must be an integer or a string, got False"),
    ],
)
def test_a_value_of_another_type_is_refused_naming_the_field(path: str, value: object, message: str) -> None:
    field = path + (".memory" if isinstance(value, dict) else "")
    problems = said(bad(path, value))
    assert len(problems) == 1 and problems[0].startswith(f"job.yaml: {field}: {message}"), problems


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("spec.precision.lossScale.init", float("inf")),
        ("spec.training.gradClipNorm", float("inf")),
        ("spec.training.learningRate", float("nan")),
        ("spec.precision.guard.minLossScale", float("-inf")),
        ("spec.task.args", {"nEmbd": float("nan")}),
    ],
)
def test_inf_and_nan_are_refused_naming_the_field(path: str, value: object) -> None:
    field = path + (".nEmbd" if isinstance(value, dict) else "")
    assert said(bad(path, value)) == [
        f"job.yaml: {field}: must be a finite number: JSON, which kubectl sends, has no .inf or .nan"
    ]


def test_whole_numbers_written_as_floats_are_integers_as_on_the_api_server() -> None:
    text = yaml.safe_dump(bad("spec.training", {"steps": "STEPS", "batchSize": 8.0}))
    jobs, problems = check_text(text.replace("STEPS", "1e5"))  # kubectl reads 1e5 as a number too
    assert not problems and (jobs[0].spec.training.steps, jobs[0].spec.training.batch_size) == (100_000, 8), problems


def test_every_problem_is_said_once_and_quickly() -> None:
    doc = bad("spec.workers", "300")
    doc["spec"]["training"] = {"steps": "ten", "learningRate": float("inf"), "batchSize": 0}
    started = time.thread_time()  # CPU seconds: what a starved machine adds to the wall clock is not the check's
    problems = said(doc)
    assert time.thread_time() - started < 1
    assert [p.split(": ")[1] for p in problems] == [
        "spec.training.learningRate",
        "spec.training.steps",
        "spec.workers",
        "spec.training.batchSize",
    ], problems


@pytest.mark.parametrize(
    ("metadata", "field", "message"),
    [
        ({"labels": {"team": 7}}, "metadata.labels[team]", "must be a string, got an integer"),
        ({"annotations": {"mpjob.dev/profile-steps": 5}}, "metadata.annotations[mpjob.dev/profile-steps]", "must be a"),
        ({"annotations": ["a=b"]}, "metadata.annotations", "must be an object, got an array"),
        ({"namespace": "Team A"}, "metadata.namespace", "must be lowercase letters, digits and '-'"),
    ],
)
def test_metadata_the_api_server_would_refuse_is_named(metadata: dict, field: str, message: str) -> None:
    doc = bad("metadata", {"name": "ok", **metadata})
    problems = said(doc)
    assert len(problems) == 1 and problems[0].startswith(f"job.yaml: {field}: {message}"), problems


def test_a_control_character_is_named_by_its_line() -> None:
    text = yaml.safe_dump(bad("spec.task.builtin", "gpt")).replace("kind:", "x: a\x07b\nkind:")
    line = text[: text.index("\x07")].count("\n") + 1
    assert [str(p) for p in check_text(text, "job.yaml")[1]] == [
        f"job.yaml: YAML syntax error at line {line}: unacceptable character #x0007: special characters are not allowed"
    ]


def test_a_null_takes_the_fields_default_as_the_api_server_stores_it() -> None:
    """`kubectl apply` of `workers: null` stores workers 1 (a null where the CRD names a field, none
    of them nullable, is dropped before defaulting): `mpjob validate` and `mpjob run` read the same."""
    doc = bad("spec.workers", None)
    doc["spec"]["precision"] = {"mode": "bf16", "fallback": None, "lossScale": None}
    doc["spec"]["training"] = {**doc["spec"].get("training", {}), "logEvery": None}
    jobs, problems = check_text(yaml.safe_dump(doc), "job.yaml")
    assert problems == []
    (job,) = jobs
    assert job.spec.workers == 1 and job.spec.training.log_every == 10
    assert job.spec.precision.fallback == ["fp32"]  # the default ladder's rungs safer than bf16
    assert job.spec.precision.loss_scale.init == 65536.0


def test_a_null_in_a_map_or_a_pod_template_field_is_dropped_as_well() -> None:
    """As the API server stores them (seen with `kubectl apply --dry-run=server`): a task's args
    lose their null values, a template's `nodeSelector: null` is no field at all."""
    doc = with_args({"depth": None, "width": 3})
    doc["spec"]["template"] = {"nodeSelector": None, "tolerations": None}
    jobs, problems = check_text(yaml.safe_dump(doc), "job.yaml")
    assert problems == []
    assert jobs[0].spec.task.args == {"width": 3}


def test_a_null_inside_a_list_item_is_dropped_as_the_api_server_drops_it() -> None:
    """The API server prunes nulls in a list's objects too (and below them): `mpjob run` trains with
    the task.args and the template `kubectl apply` would have stored."""
    doc = with_args({"layers": [{"dim": None, "acts": ["relu"]}, [{"deep": None, "x": 1}]]})
    doc["spec"]["template"] = {
        "env": [{"name": "A", "value": None}],
        "tolerations": [{"operator": "Exists", "key": None}],
    }
    jobs, problems = check_text(yaml.safe_dump(doc), "job.yaml")
    assert problems == []
    (job,) = jobs
    assert job.spec.task.args == {"layers": [{"acts": ["relu"]}, [{"x": 1}]]}
    assert job.spec.template.env == [{"name": "A"}]
    assert job.spec.template.tolerations == [{"operator": "Exists"}]
