"""Kubernetes' own core/v1 schemas for the template's pod fields (and the checkpoint's emptyDir),
and the offline check.

The schemas live in `core_v1_<version>.json` beside this file, generated from the pinned
Kubernetes version's OpenAPI document (`mpjob crd --k8s-schemas PATH`; never hand-written).
The CRD embeds them, so the API server checks `spec.template` with them; `check` reads the
same nodes so that `mpjob validate` refuses what `kubectl apply` would, naming the field.
The generator adds the value rules Kubernetes' Go validation applies but its OpenAPI document
does not say (names, label values, quantities: mpjob.k8s_openapi.VALUE_RULES) as patterns,
lengths and enums, so both refuse at `kubectl apply` what the pod API would refuse only later.
It reads exactly the keys in SCHEMA_KEYS (a test holds the file to that) but `format`, which
only a string's `date-time` deep inside an ephemeral volume's claim template would make count.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from mpjob_contract import formats

#: The Kubernetes version the test cluster pins (tests/cluster/build/kubernetes/go.mod).
KUBERNETES_VERSION = "v1.34.4"
#: Every key a schema node in the file may carry.
SCHEMA_KEYS = (
    "type",
    "description",
    "pattern",
    "maxLength",
    "maxItems",
    "minimum",
    "format",
    "enum",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "default",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
)

Violation = tuple[str, str]  # (field path, what is wrong and what is allowed)


class SchemaViolations(ValueError):
    """Fields that break a schema, each with its path below the field the model checks."""

    def __init__(self, violations: list[Violation]) -> None:
        super().__init__("; ".join(f"{path}: {message}" for path, message in violations))
        self.violations = violations


def schema_file(version: str = KUBERNETES_VERSION) -> Path:
    return Path(__file__).with_name(f"core_v1_{version}.json")


@cache
def template_schemas() -> dict[str, dict[str, Any]]:
    """Template field name (camelCase) -> its structural schema."""
    fields: dict[str, dict[str, Any]] = json.loads(schema_file().read_text())["fields"]
    return fields


@cache
def spec_schemas() -> dict[str, dict[str, Any]]:
    """Dotted spec path (camelCase, below `spec`) -> its structural schema, for the spec's other
    Kubernetes-typed fields (checkpoint.volume.emptyDir)."""
    fields: dict[str, dict[str, Any]] = json.loads(schema_file().read_text())["spec"]
    return fields


def check_template(template: dict[str, Any]) -> list[Violation]:
    """Every template field checked against its Kubernetes schema (fields it lacks are left to
    the caller's model, which refuses them)."""
    schemas = template_schemas()
    found: list[Violation] = []
    for name, value in template.items():
        if name in schemas and value is not None:
            found += check(value, schemas[name], name)
    return found


def check(value: Any, schema: dict[str, Any], path: str) -> list[Violation]:
    """What in `value` breaks `schema` (required, types, enums, unknown fields, list keys and
    length, and a scalar's pattern, length and minimum)."""
    if wrong := _wrong_type(value, schema):
        return [(path, wrong)]
    if "enum" in schema and value not in schema["enum"]:
        return [(path, f"must be one of {schema['enum']}, got {value!r}")]
    if isinstance(value, dict):
        return _check_object(value, schema, path)
    if isinstance(value, list):
        return _check_array(value, schema, path)
    return _check_scalar(value, schema, path)


def _wrong_type(value: Any, schema: dict[str, Any]) -> str | None:
    if schema.get("x-kubernetes-int-or-string"):
        ok = is_integer(value) or isinstance(value, str)
        return None if ok else f"must be an integer or a string, got {_kind(value)}"
    expected = schema.get("type")
    if expected and not _TYPES[expected](value):
        hint = formats.quoting_hint(value) if expected == "string" else ""
        return f"must be {_ARTICLE.get(expected, 'a')} {expected}, got {_kind(value)}{hint}"
    return None


def _check_scalar(value: Any, schema: dict[str, Any], path: str) -> list[Violation]:
    """The value rules Kubernetes applies when it creates the pod (the schema file carries them:
    mpjob.k8s_openapi.VALUE_RULES), named in formats' words."""
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            return [(path, f"must be at most {schema['maxLength']} characters, got {len(value)}")]
        if "pattern" in schema and re.fullmatch(schema["pattern"], value) is None:
            words = formats.allowed_by(schema["pattern"]) or f"matched by {schema['pattern']}"
            return [(path, f"must be {words}, got {value!r}")]
    elif "minimum" in schema and _TYPES["number"](value) and value < schema["minimum"]:
        return [(path, f"must be at least {schema['minimum']}, got {value!r}")]
    return []


def _check_object(value: dict[Any, Any], schema: dict[str, Any], path: str) -> list[Violation]:
    # The API server prunes nulls before it validates: a null field counts as absent.
    present = {str(k): v for k, v in value.items() if v is not None}
    properties = schema.get("properties", {})
    additional = schema.get("additionalProperties")
    missing = [name for name in schema.get("required", []) if name not in present]
    found = [(f"{path}.{name}", "required field is missing") for name in missing]
    for key, item in present.items():
        if key in properties:
            found += check(item, properties[key], f"{path}.{key}")
        elif isinstance(additional, dict):
            found += check(item, additional, f"{path}[{key}]")
        elif not schema.get("x-kubernetes-preserve-unknown-fields"):
            allowed = ", ".join(properties) or "none"
            found.append((f"{path}.{key}", f"unknown field (Kubernetes {KUBERNETES_VERSION} allows: {allowed})"))
    return found


def _check_array(value: list[Any], schema: dict[str, Any], path: str) -> list[Violation]:
    if len(value) > schema.get("maxItems", len(value)):
        return [(path, f"must have at most {schema['maxItems']} items, got {len(value)}")]
    found: list[Violation] = []
    items = schema.get("items", {})
    for i, item in enumerate(value):
        found += check(item, items, f"{path}[{i}]")
    if found:
        return found
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys", [])
        defaults = {k: items.get("properties", {}).get(k, {}).get("default") for k in keys}
        return _duplicates([{k: entry.get(k, defaults[k]) for k in keys} for entry in value], path)
    if list_type == "set":
        return _duplicates(value, path)
    return []


def _duplicates(identities: list[Any], path: str) -> list[Violation]:
    first: dict[str, int] = {}
    found: list[Violation] = []
    for i, identity in enumerate(identities):
        key = json.dumps(identity, sort_keys=True)
        if key in first:
            message = f"duplicate entry {identity} (already at [{first[key]}]); entries must be unique"
            found.append((f"{path}[{i}]", message))
        first.setdefault(key, i)
    return found


#: The API server's integers: a JSON number it reads as an int64. kubectl sends a whole YAML float
#: (`30.0`) as the integer it holds; a larger number it reads as a float, "must be of type integer".
INT64 = 2**63


def is_integer(value: Any) -> bool:
    """An integer as the API server takes one from kubectl: not a boolean, a whole number in int64."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        return False
    return isinstance(value, int | float) and -INT64 <= value < INT64


_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": is_integer,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}
_ARTICLE = {"integer": "an", "object": "an", "array": "an"}


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array", dict: "an object"}


def _kind(value: Any) -> str:
    return "null" if value is None else _KINDS.get(type(value), type(value).__name__)
