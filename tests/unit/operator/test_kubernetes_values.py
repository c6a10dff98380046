"""Values the pod API refuses (names, label values, quantities) are refused by the CRD and by
`mpjob validate` alike: each rule's edge values pass, each class of bad value is named with its
field and what the field allows (the API server's half: tests/integration's admission cases)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from mpjob import k8s_openapi
from mpjob.validation import check_text
from mpjob_contract import formats
from tests.unit.operator.cases import FULL_TEMPLATE, bad
from tests.unit.operator.test_rules import crd_schema

pytestmark = pytest.mark.unit

QUANTITIES_TAKEN = ["0", "1", "+1", "007", "1.5", ".5", "1.", "500m", "100n", "2u", "1k", "1Ki", "1.5Gi", "1Ei"]
QUANTITIES_TAKEN += ["1E", "1e3", "1E-3", "1e+3", 4]
#: Each a class ParseQuantity refuses (or a negative, which every quantity of a pod refuses).
QUANTITIES_REFUSED = ["lots", "", "1.2.3", "1 Gi", " 1", "1K", "4KiB", "1e", "1e+", "1Kii", "1mi", "-1", "-1Gi", -1]


def _problems(path: str, value: Any) -> list[str]:
    """`mpjob validate`'s problems with GOOD where `path` is `value` (sent as JSON, so that a
    string such as 1e3 stays one, as kubectl sends it from JSON or quoted YAML)."""
    return [str(p) for p in check_text(json.dumps(bad(path, value)), "job.yaml")[1]]


QUANTITY_FIELDS = ["spec.checkpoint.volume.emptyDir.sizeLimit", "spec.resources.limits.memory"]


@pytest.mark.parametrize("field", QUANTITY_FIELDS)
@pytest.mark.parametrize("value", QUANTITIES_TAKEN)
def test_every_quantity_kubernetes_parses_is_taken(field: str, value: Any) -> None:
    assert _problems(field, value) == []


@pytest.mark.parametrize("field", QUANTITY_FIELDS)
@pytest.mark.parametrize("value", QUANTITIES_REFUSED)
def test_a_quantity_kubernetes_refuses_is_named_with_what_is_allowed(field: str, value: Any) -> None:
    (problem,) = _problems(field, value)
    named = field.rsplit(".", 1)[0] if field.startswith("spec.resources") else field
    assert problem.startswith(f"job.yaml: {named}"), problem
    why = formats.QUANTITY.allows if isinstance(value, str) else "at least 0"
    assert why in problem, problem


def _from(source: str, name: str, key: str) -> dict[str, Any]:
    """An env var taken from a Secret's or ConfigMap's key."""
    return {"name": "V", "valueFrom": {source: {"name": name, "key": key}}}


# (field, values Kubernetes takes, values it refuses), each refused value a class of its own.
NAMES: list[tuple[str, list[Any], list[Any]]] = [
    (
        "spec.checkpoint.volume.persistentVolumeClaim.claimName",
        ["a", "0", "data.team-a", "a" * 253],
        ["Bad Name", "Data", "-a", "a-", "a..b", "a_b", "a" * 254],
    ),
    # Each refused one a parse error of the kubelet's (k8s.io/kubernetes/pkg/util/parsers), each taken one not.
    (
        "spec.image",
        [
            "",
            "trainer",
            "ghcr.io/team/trainer:1.4",
            "localhost:5000/t:latest",
            "MyRegistry/foo",
            "[::1]:5000/img",
            "Registry.Example.com:443/a/b_c/d__e/f---g:TAG_1.0-x",
            "a:b@sha256:" + "0" * 64,
            "img:" + "t" * 128,
        ],
        [
            "Foo",
            "foo/Bar",
            "img:",
            "img:-tag",
            "img@sha256:abc",
            " img",
            "img ",
            "a//b",
            "a/-b",
            "a_/b",
            "img:" + "t" * 129,
            "http://ghcr.io/x",
            "ghcr.io/x/",
        ],
    ),
    ("spec.runPolicy.queueName", ["", "a", "Team_A.b-1", "q" * 63], ["team queue", "-a", "a.", "q" * 64]),
    ("spec.template.priorityClassName", ["", "high", "system-node-critical"], ["High", "a b", "p" * 254]),
    ("spec.template.serviceAccountName", ["", "trainer", "a.b"], ["a_b", "Trainer", ".a"]),
    ("spec.template.env", [[{"name": "my.var-1 x"}], [{"name": "_A"}]], [[{"name": "A=B"}], [{"name": "é"}]]),
    (
        "spec.template.env",
        [[_from("secretKeyRef", "s3.creds", ".token_1.json")], [_from("configMapKeyRef", "cfg", "k" * 253)]],
        [
            [_from("secretKeyRef", "S3", "k")],
            [_from("secretKeyRef", "s", "..k")],
            [_from("secretKeyRef", "s", "a/b")],
            [_from("configMapKeyRef", "a_b", "k")],
            [_from("configMapKeyRef", "c", ".")],
            [_from("configMapKeyRef", "c", "k" * 254)],
        ],
    ),
    ("spec.template.volumes", [[{"name": "d" * 63, "emptyDir": {}}]], [[{"name": "d" * 64, "emptyDir": {}}]]),
    ("spec.template.labels", [{"team": ""}, {"team": "ML_team.a-1"}], [{"team": "ml team"}, {"team": "t" * 64}]),
    ("spec.template.nodeSelector", [{"pool": "gpu-a100"}], [{"pool": "-gpu"}]),
    (
        "spec.template.tolerations",
        [[{"operator": "Exists"}], [{"key": "nvidia.com/gpu", "value": "a100", "effect": "NoSchedule"}]],
        [[{"key": "gpu type"}], [{"key": "a/b/c"}], [{"key": "k", "value": "a b"}], [{"key": "k", "effect": "Never"}]],
    ),
]


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, ok, _ in NAMES for v in ok])
def test_each_names_edge_values_are_taken(field: str, value: Any) -> None:
    assert _problems(field, value) == []


@pytest.mark.parametrize(("field", "value"), [(f, v) for f, _, refused in NAMES for v in refused])
def test_each_bad_name_is_refused_naming_the_field_and_what_it_allows(field: str, value: Any) -> None:
    (problem,) = _problems(field, value)
    assert problem.startswith(f"job.yaml: {field}"), problem
    assert "must be " in problem or "at most" in problem, problem


def test_a_bad_claim_name_says_what_a_name_is() -> None:
    (problem,) = _problems("spec.checkpoint.volume.persistentVolumeClaim.claimName", "Bad Name")
    assert problem == (
        f"job.yaml: spec.checkpoint.volume.persistentVolumeClaim.claimName: must be {formats.DNS_SUBDOMAIN.allows}, "
        "got 'Bad Name'"
    )


def test_a_full_template_stays_valid() -> None:
    assert _problems("spec.template", FULL_TEMPLATE) == []


def _node(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The CRD's schema node at a dotted path; `name[]` is a list's items, `name{}` a map's values."""
    for part in path.split("."):
        schema = schema["properties"][part.rstrip("[]{}")]
        schema = schema["items"] if part.endswith("[]") else schema
        schema = schema["additionalProperties"] if part.endswith("{}") else schema
    return schema


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("spec.checkpoint.volume.persistentVolumeClaim.claimName", formats.DNS_SUBDOMAIN.schema()),
        ("spec.checkpoint.storage.volume.persistentVolumeClaim.claimName", formats.DNS_SUBDOMAIN.schema()),
        ("spec.runPolicy.queueName", formats.LABEL_VALUE.schema()),
        ("spec.image", {"pattern": formats.IMAGE.pattern}),
        ("spec.resources.requests{}", {"pattern": formats.QUANTITY.pattern, "minimum": 0}),
        ("spec.checkpoint.volume.emptyDir.sizeLimit", k8s_openapi.QUANTITY_RULE),
        ("spec.template.volumes[].emptyDir.sizeLimit", k8s_openapi.QUANTITY_RULE),
        ("spec.template.env[].valueFrom.resourceFieldRef.divisor", k8s_openapi.QUANTITY_RULE),
        ("spec.template.volumes[].name", formats.DNS_LABEL.schema()),
        ("spec.template.volumes[].persistentVolumeClaim.claimName", formats.DNS_SUBDOMAIN.schema()),
        ("spec.template.env[].name", formats.ENV_VAR_NAME.schema()),
        ("spec.template.env[].valueFrom.secretKeyRef.key", formats.CONFIG_KEY.schema()),
        ("spec.template.env[].valueFrom.configMapKeyRef.name", formats.DNS_SUBDOMAIN.schema()),
        ("spec.template.priorityClassName", formats.DNS_SUBDOMAIN_OR_EMPTY.schema()),
        ("spec.template.tolerations[].key", formats.TOLERATION_KEY.schema()),
        ("spec.template.labels{}", formats.LABEL_VALUE.schema()),
        ("spec.template.nodeSelector{}", formats.LABEL_VALUE.schema()),
        ("spec.template.volumes[].ephemeral.volumeClaimTemplate.metadata.labels{}", formats.LABEL_VALUE.schema()),
    ],
)
def test_the_crd_carries_each_rule_where_the_api_server_checks_it(path: str, rule: dict[str, Any]) -> None:
    node = _node(crd_schema(), path)
    assert {key: node.get(key) for key in rule} == rule


@pytest.mark.parametrize(
    ("entry", "taken"),
    [("LayerNorm", True), ("_Norm2", True), ("Layer Norm", False), ("2Norm", False), ("", False), ("nn.Norm", False)],
)
def test_the_crd_refuses_the_keep_fp32_entries_the_models_refuse(entry: str, taken: bool) -> None:
    """A keepFp32 entry no module type is named by: refused by `kubectl apply`, not stored and
    then failed by the operator as InvalidSpec."""
    pattern = _node(crd_schema(), "spec.precision.keepFp32[]").get("pattern")
    assert pattern is not None and (re.fullmatch(pattern, entry) is not None) == taken
    assert (_problems("spec.precision.keepFp32", [entry]) == []) == taken
