"""Kubernetes' own schemas for the template's pod fields, taken from its OpenAPI document.

`spec.template` offers pod fields (env, volumes, tolerations, ...). Their schemas are not
written here: `generate` takes them from the OpenAPI v3 document of the pinned Kubernetes
version (`k8s.io/kubernetes@<version>/api/openapi-spec/v3/api__v1_openapi.json` in the Go
module cache after `bash tests/cluster/build.sh`) and rewrites them into structural CRD
schema nodes: references inlined, merge-patch hints dropped, Kubernetes' one union
(int-or-string) in the form a CRD allows. The result is committed
(`mpjob_contract/k8s/`), so generating the CRD and `mpjob validate` never need the module
cache; `mpjob crd --k8s-schemas PATH` regenerates it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from mpjob_contract import formats, k8s
from mpjob_contract.pod_volumes import MAX_MOUNT_PATH, MAX_TEMPLATE_VOLUME_MOUNTS, MAX_TEMPLATE_VOLUMES

CORE = "io.k8s.api.core.v1."
META = "io.k8s.apimachinery.pkg.apis.meta.v1."
#: Each template field and the Kubernetes field whose schema it takes (definition, property).
TEMPLATE_FIELDS: dict[str, tuple[str, str]] = {
    "labels": (META + "ObjectMeta", "labels"),
    "annotations": (META + "ObjectMeta", "annotations"),
    "nodeSelector": (CORE + "PodSpec", "nodeSelector"),
    "tolerations": (CORE + "PodSpec", "tolerations"),
    "env": (CORE + "Container", "env"),
    "volumes": (CORE + "PodSpec", "volumes"),
    "volumeMounts": (CORE + "Container", "volumeMounts"),
    "priorityClassName": (CORE + "PodSpec", "priorityClassName"),
    "serviceAccountName": (CORE + "PodSpec", "serviceAccountName"),
    "imagePullSecrets": (CORE + "PodSpec", "imagePullSecrets"),
}
#: Spec fields outside the template that take a Kubernetes schema, by dotted spec path.
SPEC_FIELDS: dict[str, tuple[str, str]] = {
    "checkpoint.volume.emptyDir": (CORE + "Volume", "emptyDir"),
}
#: Kubernetes' value rules that its OpenAPI document does not carry: its Go validation applies them
#: when the Job controller creates the pod, long after the CRD stored the value. Each adds to the
#: schema of one definition's property (wherever that definition appears) a pattern and a length
#: (mpjob_contract.formats) or an enum.
VALUE_RULES: dict[tuple[str, str], dict[str, Any]] = {
    (CORE + "Volume", "name"): formats.DNS_LABEL.schema(),
    (CORE + "PersistentVolumeClaimVolumeSource", "claimName"): formats.DNS_SUBDOMAIN.schema(),
    (CORE + "EnvVar", "name"): formats.ENV_VAR_NAME.schema(),
    (CORE + "SecretKeySelector", "name"): formats.DNS_SUBDOMAIN.schema(),
    (CORE + "SecretKeySelector", "key"): formats.CONFIG_KEY.schema(),
    (CORE + "ConfigMapKeySelector", "name"): formats.DNS_SUBDOMAIN.schema(),
    (CORE + "ConfigMapKeySelector", "key"): formats.CONFIG_KEY.schema(),
    (CORE + "PodSpec", "priorityClassName"): formats.DNS_SUBDOMAIN_OR_EMPTY.schema(),
    (CORE + "PodSpec", "serviceAccountName"): formats.DNS_SUBDOMAIN_OR_EMPTY.schema(),
    (CORE + "Toleration", "key"): formats.TOLERATION_KEY.schema(),
    (CORE + "Toleration", "value"): formats.LABEL_VALUE.schema(),
    (CORE + "Toleration", "operator"): {"enum": ["", "Equal", "Exists"]},
    (CORE + "Toleration", "effect"): {"enum": ["", "NoSchedule", "PreferNoSchedule", "NoExecute"]},
}
#: Our bounds, not Kubernetes' (mpjob_contract.pod_volumes says why): added like VALUE_RULES.
COST_BOUNDS: dict[tuple[str, str], dict[str, Any]] = {
    (CORE + "PodSpec", "volumes"): {"maxItems": MAX_TEMPLATE_VOLUMES},
    (CORE + "Container", "volumeMounts"): {"maxItems": MAX_TEMPLATE_VOLUME_MOUNTS},
    (CORE + "VolumeMount", "mountPath"): {"maxLength": MAX_MOUNT_PATH},
}
#: Maps whose values are label values. Their keys are label keys, which only a CEL rule over the
#: whole map could check, and its estimated cost on a map of unbounded size would exceed the API
#: server's budget: keys are left to the pod API.
LABEL_VALUE_MAPS = frozenset({(META + "ObjectMeta", "labels"), (CORE + "PodSpec", "nodeSelector")})
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
#: Every quantity the pod API takes is ParseQuantity's grammar and at least 0.
QUANTITY_RULE: dict[str, Any] = {**formats.QUANTITY.schema(), "minimum": 0}
#: Properties left out of Kubernetes' schemas, by definition. ObjectMeta.managedFields holds
#: FieldsV1, a free-form object: in a CRD it would accept a document nested thousands of levels
#: deep (more than a client's JSON parser reads). The template meets ObjectMeta only in an
#: ephemeral volume's claim template, where the pod API refuses every field but labels and
#: annotations anyway.
OMITTED: dict[str, frozenset[str]] = {META + "ObjectMeta": frozenset({"managedFields"})}
#: Keys dropped: descriptions below a template field (they would make the CRD five times larger
#: than `kubectl apply` stores comfortably; `kubectl explain pod.spec` has them); merge-patch
#: hints, union and GVK metadata (they mean nothing to a CRD); defaults, Go zero values that
#: would hide a missing required field (the pod API applies the real ones) except where a CRD
#: needs one: on a list-map key that is not required.
DROPPED = frozenset(
    {
        "default",
        "description",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
        "x-kubernetes-group-version-kind",
    }
)
#: Keys kept as they are: what a structural CRD schema allows and `k8s.check` reads.
KEPT = frozenset(k8s.SCHEMA_KEYS) - DROPPED - {"x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields"}
#: `kubectl explain` paths of the definitions the fields come from.
EXPLAIN = {
    "ObjectMeta": "pod.metadata",
    "PodSpec": "pod.spec",
    "Container": "pod.spec.containers",
    "Volume": "pod.spec.volumes",
}
OPENAPI_FILE = "api/openapi-spec/v3/api__v1_openapi.json"
GO_MOD = Path("tests/cluster/build/kubernetes/go.mod")


def pinned_version(go_mod: Path = GO_MOD) -> str:
    """The k8s.io/kubernetes version the test cluster is built from."""
    found = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", go_mod.read_text(), re.MULTILINE)
    if not found:
        raise ValueError(f"{go_mod} does not pin k8s.io/kubernetes")
    return found.group(1)


def module_cache_document(version: str) -> Path:
    """Where the Go module cache keeps that version's OpenAPI v3 core/v1 document."""
    cache = Path(os.environ.get("GOMODCACHE") or Path(os.environ.get("GOPATH") or Path.home() / "go") / "pkg/mod")
    return cache / f"k8s.io/kubernetes@{version}" / OPENAPI_FILE


def generate(
    document: dict[str, Any],
    version: str,
    *,
    fields: dict[str, tuple[str, str]] = TEMPLATE_FIELDS,
    spec_fields: dict[str, tuple[str, str]] = SPEC_FIELDS,
) -> dict[str, Any]:
    """The template fields' (and SPEC_FIELDS') structural schemas from one OpenAPI v3 document."""
    defs = document["components"]["schemas"]
    return {
        "note": f"Generated from Kubernetes {version}'s OpenAPI v3 document (k8s.io/kubernetes@{version}/"
        f"{OPENAPI_FILE}, in the Go module cache after `bash tests/cluster/build.sh`) by "
        "`uv run --no-sync mpjob crd --k8s-schemas [PATH] --write`. Do not edit by hand.",
        "kubernetesVersion": version,
        "fields": {name: _field(defs, *where, version=version) for name, where in fields.items()},
        "spec": {path: _field(defs, *where, version=version) for path, where in spec_fields.items()},
    }


def _field(defs: dict[str, Any], definition: str, prop: str, *, version: str) -> dict[str, Any]:
    """One template field: Kubernetes' schema of `definition.prop`, its own description kept."""
    source = defs[definition]["properties"][prop]
    kind = definition.rsplit(".", 1)[-1]
    explain = f"{EXPLAIN.get(kind, kind.lower())}.{prop}"
    origin = f"Kubernetes {version} {kind}.{prop}; `kubectl explain {explain}` describes its fields."
    text = source.get("description", "")
    converted = _with_value_rules(_convert(source, defs, (definition,)), definition, prop)
    return {"description": f"{text} ({origin})" if text else origin, **converted}


def write(source: Path, version: str, out: Path | None = None) -> Path:
    """Regenerate the committed schema file from `source`; returns where it was written."""
    target = out or k8s.schema_file(version)
    schemas = generate(json.loads(source.read_text()), version)
    target.write_text(json.dumps(schemas, indent=1, sort_keys=True) + "\n")
    return target


def _resolve(node: dict[str, Any], defs: dict[str, Any], stack: tuple[str, ...]) -> tuple[dict[str, Any], tuple]:
    """Inline `$ref` and the `allOf: [{$ref}]` wrapper; the referring node's keys win."""
    while "$ref" in node or "allOf" in node:
        refs = [node["$ref"]] if "$ref" in node else [o["$ref"] for o in node["allOf"]]
        if len(refs) != 1:
            raise ValueError(f"{stack[-1]}: cannot inline allOf of {len(node['allOf'])} schemas")
        name = refs[0].split("/")[-1]
        if name in stack:
            raise ValueError(f"recursive schema {' -> '.join((*stack, name))}: a CRD cannot say that")
        rest = {k: v for k, v in node.items() if k not in ("$ref", "allOf")}
        node, stack = {**defs[name], **rest}, (*stack, name)
    return node, stack


def _convert(node: dict[str, Any], defs: dict[str, Any], stack: tuple[str, ...]) -> dict[str, Any]:
    node, stack = _resolve(node, defs, stack)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "oneOf":
            out.update(_union(value, stack))
        elif _kept(key, value, stack):
            out[key] = value
    if "properties" in out:
        omitted = OMITTED.get(stack[-1], frozenset())
        out["properties"] = {
            k: _with_value_rules(_convert(v, defs, stack), stack[-1], k)
            for k, v in out["properties"].items()
            if k not in omitted
        }
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(out["additionalProperties"], defs, stack)
    if "items" in out:
        out["items"] = _convert(out["items"], defs, stack)
        _map_key_defaults(out, node["items"], defs, stack)
    if out.get("type") == "object" and "properties" not in out and "additionalProperties" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True  # free-form (FieldsV1)
    if stack[-1] == QUANTITY:
        out.update(QUANTITY_RULE)
    return out


def _with_value_rules(node: dict[str, Any], definition: str, prop: str) -> dict[str, Any]:
    """`definition.prop`'s converted schema with the value rules Kubernetes applies to it (and our
    COST_BOUNDS)."""
    node.update(VALUE_RULES.get((definition, prop), {}))
    node.update(COST_BOUNDS.get((definition, prop), {}))
    if (definition, prop) in LABEL_VALUE_MAPS:
        node["additionalProperties"] = {**node["additionalProperties"], **formats.LABEL_VALUE.schema()}
    return node


def _kept(key: str, value: Any, stack: tuple[str, ...]) -> bool:
    if key in DROPPED or (key == "format" and value == "int-or-string"):
        return False
    if key in KEPT:
        return True
    raise ValueError(f"{stack[-1]}: {key!r} has no place in a CRD schema and is not known to be droppable")


def _union(options: list[dict[str, Any]], stack: tuple[str, ...]) -> dict[str, Any]:
    """IntOrString and Quantity (string or number): a CRD's one union is int-or-string."""
    types = {o.get("type") for o in options}
    if "string" not in types or not types <= {"string", "integer", "number"}:
        raise ValueError(f"{stack[-1]}: a CRD cannot say oneOf {sorted(map(str, types))}")
    return {"x-kubernetes-int-or-string": True}


def _map_key_defaults(out: dict[str, Any], items: dict[str, Any], defs: dict[str, Any], stack: tuple) -> None:
    """A list-map key must be required or defaulted in a CRD: keep Kubernetes' default there."""
    if out.get("x-kubernetes-list-type") != "map":
        return
    raw, _ = _resolve(items, defs, stack)
    for key in out.get("x-kubernetes-list-map-keys", []):
        if key not in out["items"].get("required", []):
            out["items"]["properties"][key]["default"] = raw["properties"][key]["default"]
