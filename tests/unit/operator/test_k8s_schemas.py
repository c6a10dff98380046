"""The template's Kubernetes schemas: generated from Kubernetes' OpenAPI (never by hand), the
same nodes in the CRD and in `mpjob validate`, and the generator's rewriting rules."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob import k8s_openapi
from mpjob.crd import CEL_RULES, crd_yaml
from mpjob_contract import k8s
from mpjob_contract.api import PodTemplateOverrides

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[3]
OPENAPI = k8s_openapi.module_cache_document(k8s.KUBERNETES_VERSION)


def _nodes(node: Any) -> list[dict[str, Any]]:
    """Every schema node below (and including) `node`."""
    if not isinstance(node, dict):
        return []
    found = [node]
    for key in ("items", "additionalProperties"):
        found += _nodes(node.get(key))
    for child in node.get("properties", {}).values():
        found += _nodes(child)
    return found


def test_the_schemas_are_of_the_kubernetes_version_the_test_cluster_pins() -> None:
    assert k8s_openapi.pinned_version(REPO / k8s_openapi.GO_MOD) == k8s.KUBERNETES_VERSION
    assert json.loads(k8s.schema_file().read_text())["kubernetesVersion"] == k8s.KUBERNETES_VERSION


@pytest.mark.skipif(not OPENAPI.is_file(), reason=f"{OPENAPI} absent: `bash tests/cluster/build.sh` downloads it")
def test_committed_schemas_match_kubernetes_openapi() -> None:
    fresh = k8s_openapi.generate(json.loads(OPENAPI.read_text()), k8s.KUBERNETES_VERSION)
    committed = json.loads(k8s.schema_file().read_text())
    assert fresh == committed, "drifted: run `uv run --no-sync mpjob crd --k8s-schemas --write`"


def test_every_template_field_has_its_kubernetes_schema() -> None:
    aliases = {field.alias or name for name, field in PodTemplateOverrides.model_fields.items()}
    assert aliases == set(k8s.template_schemas()) == set(k8s_openapi.TEMPLATE_FIELDS)


def _rules(node: Any, path: str) -> dict[str, Any]:
    """The CEL rules below `node`, by CEL_RULES's path notation (`name[]`: the list's items),
    taken out of the schema."""
    if not isinstance(node, dict):
        return {}
    found = {path: node.pop("x-kubernetes-validations")} if "x-kubernetes-validations" in node else {}
    if isinstance(node.get("items"), dict):
        found.update(_rules(node["items"], path + "[]"))
    for name, child in node.get("properties", {}).items():
        found.update(_rules(child, f"{path}.{name}"))
    return found


def test_the_crd_template_is_the_kubernetes_schemas_verbatim() -> None:
    """Kubernetes' schemas as they are, plus only the CEL rules crd.py names below the template
    (a rule adds a check; it never changes what the schemas say)."""
    crd = yaml.safe_load(crd_yaml())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["template"]["properties"]
    rules = {p: r for name, node in template.items() for p, r in _rules(node, f"spec.template.{name}").items()}
    assert rules == {p: r for p, r in CEL_RULES.items() if p.startswith("spec.template.")}
    assert "spec.template.volumes[].projected.sources[]" in rules  # no ServiceAccount token
    assert template == k8s.template_schemas()


def test_the_schema_file_holds_only_what_the_checker_reads_and_a_crd_allows() -> None:
    nodes = [n for schema in k8s.template_schemas().values() for n in _nodes(schema)]
    assert len(nodes) > 300  # volumes with every source: the whole closure is there
    assert {key for n in nodes for key in n} <= set(k8s.SCHEMA_KEYS)
    assert not any("$ref" in json.dumps(n) or "oneOf" in n for n in nodes)
    volumes = k8s.template_schemas()["volumes"]
    assert volumes["x-kubernetes-list-type"] == "map" and volumes["x-kubernetes-list-map-keys"] == ["name"]
    assert "hostPath" in volumes["items"]["properties"]


# ------------------------------------------------------------------ the generator's rules

DEFS: dict[str, Any] = {
    "x.Pod": {
        "properties": {
            "things": {
                "type": "array",
                "items": {"allOf": [{"$ref": "#/components/schemas/x.Thing"}], "default": {}},
                "x-kubernetes-list-type": "map",
                "x-kubernetes-list-map-keys": ["name"],
                "x-kubernetes-patch-strategy": "merge",
                "x-kubernetes-patch-merge-key": "name",
                "description": "Things.",
            },
        }
    },
    "x.Thing": {
        "type": "object",
        "description": "dropped below the field",
        "properties": {
            "name": {"type": "string", "default": ""},
            "size": {"$ref": "#/components/schemas/x.Quantity"},
            "port": {"format": "int-or-string", "oneOf": [{"type": "integer"}, {"type": "string"}]},
            "fields": {"type": "object"},
            "count": {"type": "integer", "format": "int32", "default": 0},
        },
        "required": ["count"],
    },
    "x.Quantity": {"oneOf": [{"type": "string"}, {"type": "number"}]},
}


def _generate(defs: dict[str, Any]) -> dict[str, Any]:
    document = {"components": {"schemas": defs}}
    fields = k8s_openapi.generate(document, "v0.0.0", fields={"things": ("x.Pod", "things")}, spec_fields={})["fields"]
    return fields["things"]  # type: ignore[no-any-return]


def test_generator_inlines_references_and_writes_unions_as_a_crd_can() -> None:
    things = _generate(DEFS)
    item = things["items"]
    assert things["description"].startswith("Things. (Kubernetes v0.0.0 Pod.things")
    assert "description" not in item and "x-kubernetes-patch-strategy" not in things
    assert item["properties"]["size"] == {"x-kubernetes-int-or-string": True}  # string-or-number Quantity
    assert item["properties"]["port"] == {"x-kubernetes-int-or-string": True}
    assert item["properties"]["fields"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert item["properties"]["count"] == {"type": "integer", "format": "int32"}  # a zero default hides nothing


def test_generator_keeps_only_the_defaults_a_list_map_key_needs() -> None:
    item = _generate(DEFS)["items"]
    assert item["properties"]["name"] == {"type": "string", "default": ""}  # key, not required
    required_key = json.loads(json.dumps(DEFS))
    required_key["x.Thing"]["required"] = ["name"]
    assert _generate(required_key)["items"]["properties"]["name"] == {"type": "string"}


def test_generator_refuses_what_it_cannot_say_rather_than_guess() -> None:
    recursive = json.loads(json.dumps(DEFS))
    recursive["x.Thing"]["properties"]["child"] = {"$ref": "#/components/schemas/x.Thing"}
    with pytest.raises(ValueError, match="recursive schema"):
        _generate(recursive)
    unknown = json.loads(json.dumps(DEFS))
    unknown["x.Thing"]["properties"]["name"]["x-kubernetes-new-marker"] = True
    with pytest.raises(ValueError, match="x-kubernetes-new-marker"):
        _generate(unknown)


# ------------------------------------------------------------------ the offline check


def test_check_reads_nulls_as_absent_as_the_api_server_prunes_them() -> None:
    env = k8s.template_schemas()["env"]
    assert k8s.check([{"name": "A", "value": None}], env, "env") == []
    assert k8s.check([{"name": None}], env, "env") == [("env[0].name", "required field is missing")]


def test_check_types_int_or_string_and_booleans_apart() -> None:
    mounts = k8s.template_schemas()["volumeMounts"]
    assert k8s.check([{"name": "v", "mountPath": "/m", "readOnly": "yes"}], mounts, "m") == [
        ("m[0].readOnly", "must be a boolean, got a string")
    ]
    volumes = k8s.template_schemas()["volumes"]
    for size, ok in (("1Gi", True), (1024, True), (True, False), ([1], False)):
        found = k8s.check([{"name": "v", "emptyDir": {"sizeLimit": size}}], volumes, "v")
        assert (found == []) is ok, (size, found)
    tolerations = k8s.template_schemas()["tolerations"]
    assert k8s.check([{"tolerationSeconds": True}], tolerations, "t")[0][1] == "must be an integer, got a boolean"


def test_check_names_what_an_unknown_field_could_have_been() -> None:
    env = [{"name": "A", "valueFrom": {"secretRef": {}}}]
    (path, message), *_ = k8s.check(env, k8s.template_schemas()["env"], "env")
    assert path == "env[0].valueFrom.secretRef" and "secretKeyRef" in message and "v1.34.4" in message


# ------------------------------------------------------------------ nothing free-form


def _free_form(node: Any, path: str) -> list[str]:
    """Paths of the schema nodes below `node` that keep unknown fields."""
    if not isinstance(node, dict):
        return []
    found = [path] if node.get("x-kubernetes-preserve-unknown-fields") else []
    for key in ("items", "additionalProperties"):
        found += _free_form(node.get(key), f"{path}.{key}")
    for name, child in node.get("properties", {}).items():
        found += _free_form(child, f"{path}.{name}")
    return found


def test_no_spec_field_takes_a_document_of_any_depth() -> None:
    """A free-form field lets the API server store 10,000 levels; only task.args' values keep
    unknown fields, every such node bounded below (items and additionalProperties, or none at all:
    the leaf that refuses lists and maps); status keeps them for fields a newer operator writes."""
    crd = yaml.safe_load(crd_yaml())
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    free = _free_form(root, "")
    assert ".status" in free
    args = ".spec.task.args.additionalProperties"
    assert all(p.startswith(args) for p in free if p != ".status"), free
    for path in (p for p in free if p != ".status"):
        node = root
        for part in path.strip(".").split("."):
            node = node["properties"][part] if part not in ("items", "additionalProperties") else node[part]
        leaf = (node.get("maxItems"), node.get("maxProperties")) == (0, 0)
        assert leaf or ("items" in node and "additionalProperties" in node), path


def test_the_template_leaves_out_managed_fields_the_pod_api_refuses_there() -> None:
    claim = k8s.template_schemas()["volumes"]["items"]["properties"]["ephemeral"]["properties"]["volumeClaimTemplate"]
    assert {"labels", "annotations"} <= set(claim["properties"]["metadata"]["properties"])
    assert "managedFields" not in claim["properties"]["metadata"]["properties"]


def test_the_checkpoint_empty_dir_is_kubernetes_empty_dir_volume_source() -> None:
    crd = yaml.safe_load(crd_yaml())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    empty_dir = spec["properties"]["checkpoint"]["properties"]["volume"]["properties"]["emptyDir"]
    assert empty_dir == k8s.spec_schemas()["checkpoint.volume.emptyDir"]
    assert set(empty_dir["properties"]) == {"medium", "sizeLimit"}
    volumes = k8s.template_schemas()["volumes"]  # the same source as a template volume's emptyDir
    assert empty_dir["properties"] == volumes["items"]["properties"]["emptyDir"]["properties"]
