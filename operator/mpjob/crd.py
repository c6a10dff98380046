"""The MixedPrecisionJob CRD, generated from the pydantic API models (the one source).

The pydantic JSON schema is turned into a Kubernetes structural schema: references are
inlined, Optional becomes a plain optional field, numeric bounds use OpenAPI v3.0's
boolean exclusive bounds, and the cross-field rules (mpjob_contract.rules: each one's CEL beside
the Python check the pydantic validators call) become `x-kubernetes-validations`, so the API
server and `mpjob validate` reject the same manifests. So do the transition rules with which the
API server refuses an update that changes what a checkpoint binds (mpjob_contract.binding).

No field of the spec is free-form: a free-form field (x-kubernetes-preserve-unknown-fields with
nothing below it) lets the API server store a document nested 10,000 levels deep, which no
client's JSON parser reads by default. The template's pod fields and checkpoint.volume.emptyDir
take Kubernetes' own schemas; task.args values are bounded by `_task_arg_value`. Only `status`
keeps unknown fields (a newer operator's status fields survive an older CRD); the status
subresource is written by the operator alone.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any

import yaml

from mpjob_contract import api, binding, k8s, rules

DEFAULT_PATHS = [
    Path("crds/mixedprecisionjobs.mpjob.dev.yaml"),
    Path("helm/mpjob/crds/mixedprecisionjobs.mpjob.dev.yaml"),
]

#: Cross-field rules, by schema path (dotted, camelCase): the table in mpjob_contract.rules,
#: whose checks the pydantic validators call too, and the transition rules that keep a job's
#: checkpoint-bound settings as they were created (mpjob_contract.binding).
CEL_RULES: dict[str, list[dict[str, str]]] = rules.cel_by_path([*rules.RULES, *binding.UNCHANGED.values()])

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Precision", "type": "string", "jsonPath": ".status.precision"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Loss", "type": "number", "jsonPath": ".status.loss"},
    {"name": "Scale", "type": "number", "jsonPath": ".status.lossScale"},
    {"name": "Attempt", "type": "integer", "jsonPath": ".status.attempt"},
    {"name": "Workers", "type": "integer", "jsonPath": ".status.workers"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Rewrite one pydantic JSON-schema node into a structural OpenAPI v3 schema node."""
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = deepcopy(defs[node["$ref"].split("/")[-1]])
        target.update({k: v for k, v in node.items() if k != "$ref"})
        return _structural(target, defs)
    node = dict(node)
    if "anyOf" in node:
        merged = _union(node, defs)
        if merged is not None:
            return merged
    _scalars(node)
    if node.get("type") == "object" or "properties" in node:
        _object(node, defs)
    if node.get("type") == "array" and "items" in node:
        node["items"] = _structural(node["items"], defs)
    if not node.get("type") and "x-kubernetes-int-or-string" not in node and "enum" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True
        node["type"] = "object" if node.get("default") != [] else "array"
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    return node


def _union(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any] | None:
    """`X | None` becomes X; int-or-string becomes Kubernetes' own form; others cannot be said."""
    options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
    if len(options) == 1:
        merged: dict[str, Any] = _structural(options[0], defs)
        merged.update({k: v for k, v in node.items() if k not in ("default",) or v is not None})
        return merged
    if not {o.get("type") for o in options} <= {"integer", "string"}:
        raise ValueError(f"cannot express a union of {options} structurally")
    node.update({"x-kubernetes-int-or-string": True})
    node["anyOf"] = [{"type": "integer"}, {"type": "string"}]  # the only structural int-or-string
    # Each option's bounds on the node: a pattern holds strings only, a minimum numbers only.
    for key in ("minimum", "pattern"):
        bound = next((o[key] for o in options if key in o), None)
        if bound is not None:
            node[key] = bound
    return None


def _scalars(node: dict[str, Any]) -> None:
    """Titles out, null defaults out, const as enum, JSON Schema 2020 bounds as OpenAPI 3.0's."""
    node.pop("title", None)
    if node.get("default", 0) is None:
        node.pop("default")
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, inclusive in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[inclusive] = node.pop(bound)
            node[bound] = True


def _object(node: dict[str, Any], defs: dict[str, Any]) -> None:
    node["type"] = "object"
    props = node.get("properties")
    if props:
        optional = {k for k, v in props.items() if any(o.get("type") == "null" for o in v.get("anyOf", []))}
        node["properties"] = {k: _structural(v, defs) for k, v in props.items()}
        for key, prop in node["properties"].items():
            # Objects built by default factories default to {} so nested defaults apply.
            nested = prop.get("type") == "object" and "properties" in prop
            if nested and key not in optional and key not in node.get("required", []):
                prop.setdefault("default", {})
    additional = node.get("additionalProperties")
    if additional is True or (isinstance(additional, dict) and not additional):
        node.pop("additionalProperties")
        node["x-kubernetes-preserve-unknown-fields"] = True
    elif isinstance(additional, dict):
        node["additionalProperties"] = _structural(additional, defs)
    elif additional is False:
        node.pop("additionalProperties")
    if not props and "additionalProperties" not in node:
        node["x-kubernetes-preserve-unknown-fields"] = True


def _schema_of(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    return _structural(raw, defs)  # type: ignore[no-any-return]


def _at(schema: dict[str, Any], path: str) -> dict[str, Any]:
    """The node at a dotted path; `name[]` is the items of the list `name`."""
    node = schema
    for part in [p for p in path.split(".") if p]:
        node = node["properties"][part.removesuffix("[]")]
        if part.endswith("[]"):
            node = node["items"]
    return node


def _kubernetes_template(spec: dict[str, Any]) -> None:
    """The template's pod fields take Kubernetes' own schemas (mpjob_contract.k8s)."""
    template = spec["properties"]["template"]
    schemas = k8s.template_schemas()
    if set(template["properties"]) != set(schemas):
        raise ValueError(
            f"spec.template fields {sorted(template['properties'])} differ from the Kubernetes schemas' "
            f"{sorted(schemas)}: regenerate them with `mpjob crd --k8s-schemas`"
        )
    template["properties"] = {name: deepcopy(schemas[name]) for name in template["properties"]}


def _kubernetes_spec_fields(spec: dict[str, Any]) -> None:
    """checkpoint.volume.emptyDir (and any other k8s.spec_schemas() path) takes Kubernetes' schema."""
    for path, schema in k8s.spec_schemas().items():
        for place in _places(path):
            *parents, name = place.split(".")
            _at(spec, ".".join(parents))["properties"][name] = deepcopy(schema)


def _places(path: str) -> list[str]:
    """Where a spec path's schema goes: the checkpoint volume is also checkpoint.storage.volume."""
    volume = "checkpoint.volume."
    return [path, "checkpoint.storage.volume." + path.removeprefix(volume)] if path.startswith(volume) else [path]


def _task_arg_value(levels: int) -> dict[str, Any]:
    """A task.args value: a scalar, or lists and maps nesting at most `levels` deep.

    A structural schema cannot type a union of scalar, list and map, so each node is untyped
    (x-kubernetes-preserve-unknown-fields) and bounds what is below it with `items` and
    `additionalProperties`; a node at the bound refuses every list and map, as no list has both
    at least one item and at most none (nor a map properties). The API server validates only as
    deep as the schema goes, so a deeper document costs it no more than this."""
    if levels == 0:
        return {
            "x-kubernetes-preserve-unknown-fields": True,
            "minItems": 1,
            "maxItems": 0,
            "minProperties": 1,
            "maxProperties": 0,
        }
    below = _task_arg_value(levels - 1)
    return {"x-kubernetes-preserve-unknown-fields": True, "items": below, "additionalProperties": deepcopy(below)}


def _bounded_task_args(spec: dict[str, Any]) -> None:
    args = _at(spec, "task.args")
    args.pop("x-kubernetes-preserve-unknown-fields", None)
    args["additionalProperties"] = _task_arg_value(api.MAX_TASK_ARG_DEPTH)


def openapi_schema() -> dict[str, Any]:
    spec = _schema_of(api.MixedPrecisionJobSpec)
    _kubernetes_template(spec)
    _kubernetes_spec_fields(spec)
    _bounded_task_args(spec)
    status = _schema_of(api.MixedPrecisionJobStatus)
    status["x-kubernetes-preserve-unknown-fields"] = True  # status fields may grow
    root: dict[str, Any] = {
        "type": "object",
        "description": "A PyTorch mixed-precision training job that falls back to a safer precision "
        "(fp16 -> bf16 -> fp32) from its last good checkpoint when a precision cannot go on.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    for path, validations in CEL_RULES.items():
        _at(root, path)["x-kubernetes-validations"] = validations
    return root


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{api.PLURAL}.{api.GROUP}",
            "labels": {"app.kubernetes.io/name": "mpjob", "app.kubernetes.io/component": "crd"},
        },
        "spec": {
            "group": api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": api.KIND,
                "listKind": f"{api.KIND}List",
                "plural": api.PLURAL,
                "singular": api.SINGULAR,
                "shortNames": list(api.SHORT_NAMES),
                "categories": ["mpjob", "ml"],
            },
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    header = (
        "# Generated by `mpjob crd` from contract/mpjob_contract/api.py and the Kubernetes schemas in\n"
        "# contract/mpjob_contract/k8s/. Do not edit by hand.\n"
    )
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
