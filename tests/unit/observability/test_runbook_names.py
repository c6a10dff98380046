"""What a runbook tells the on-call engineer to run or read exists: every field of the job it
names (`spec.x.y`, `status.x`, `precision.guard.y`, a kubectl jsonpath), every mpjob command,
metric, chart value and condition or reason it filters on. A runbook step that names a field
the CRD lost, or a command that was renamed, sends the person paged to a dead end."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from mpjob.cli import COMMANDS
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract.codes import FinishReason, Reason
from tests.unit.observability.promtool import REPO, RUNBOOKS, series_labels

pytestmark = pytest.mark.unit

CRD = REPO / "crds/mixedprecisionjobs.mpjob.dev.yaml"
VALUES = REPO / "helm/mpjob/values.yaml"
#: Kubernetes' own fields a runbook reads from pods (`kubectl get pod ... -o jsonpath`), not the job's.
POD_FIELDS = {"spec.nodeName", "status.containerStatuses"}
#: Code spans and fenced blocks: what a runbook gives to type or to look for.
CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)


def schema() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def resolves(node: dict[str, Any], path: list[str]) -> bool:
    """Whether `path` names a field below `node` (an object's free-form part takes any name)."""
    for part in path:
        node = node.get("items", node)
        props = node.get("properties")
        if props is None:
            return bool(node.get("x-kubernetes-preserve-unknown-fields") or node.get("additionalProperties"))
        if part not in props:
            return False
        node = props[part]
    return True


def values_has(path: list[str]) -> bool:
    node: Any = yaml.safe_load(VALUES.read_text())
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def unknown_names(text: str) -> list[str]:
    """The names in `text`'s code spans and blocks that exist nowhere in mpjob."""
    root = schema()["properties"]
    spec_keys = "|".join(sorted(root["spec"]["properties"]))
    known_reasons = {str(v) for enum in (ConditionType, ConditionReason, Reason, FinishReason) for v in enum}
    metrics = set(series_labels())
    bad: list[str] = []
    for code in (m.group(0) for m in CODE.finditer(text)):
        for found in re.finditer(r"(?<![\w/-])\.?((?:spec|status)(?:\.\w+|\[[^\]]*\])+)", code):
            path = re.sub(r"\[[^\]]*\]", "", found.group(1)).split(".")
            if ".".join(path[:2]) not in POD_FIELDS and not resolves(root[path[0]], path[1:]):
                bad.append(found.group(1))
        for found in re.finditer(rf"(?<![\w./-])((?:{spec_keys})(?:\.[a-zA-Z]\w*)+)(?![\w(])", code):
            if not resolves(root["spec"], found.group(1).split(".")):
                bad.append(found.group(1))
        for found in re.finditer(r"(?<![\w./-])((?:operator|peering|monitoring|rbac)\.[\w.]+?)(?==|`|\s|$)", code):
            if not values_has(found.group(1).split(".")):
                bad.append(found.group(1))
        bad += [f"mpjob {c}" for c in re.findall(r"(?<![\w/.-])mpjob ([a-z]+)\b", code) if c not in COMMANDS]
        named = re.findall(r"\bmpjob_(?:trainer|operator)_\w+", code)
        bad += [m for m in named if m not in metrics and f"{m}_sum" not in metrics]  # a histogram by its name
        bad += [r for r in re.findall(r'@\.(?:reason|type)=="(\w+)"', code) if r not in known_reasons]
    return bad


@pytest.mark.parametrize("page", sorted(RUNBOOKS.glob("*.md")), ids=lambda p: p.name)
def test_every_name_a_runbook_gives_exists(page: Any) -> None:
    assert unknown_names(page.read_text()) == []


def test_a_name_that_does_not_exist_is_caught() -> None:
    text = (
        "`spec.precision.guard.maxNaNs` and `.status.attempts[*].exitReason` "
        "```sh\nmpjob describe NAME\nkubectl get mpj -o jsonpath='{.status.conditions[?(@.reason==\"Backoff\")]}'\n"
        "promql: mpjob_trainer_nan_total\n```\n`training.logEach`, `operator.backoffSeconds`, `guard.replaySteps`"
    )
    assert unknown_names(text) == [
        "spec.precision.guard.maxNaNs",
        "status.attempts[*].exitReason",
        "mpjob describe",
        "mpjob_trainer_nan_total",
        "Backoff",
        "training.logEach",
        "operator.backoffSeconds",
    ]
