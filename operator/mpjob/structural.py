"""A manifest's values checked against the CRD's types, as the API server checks them first.

The models read a value in pydantic's lax mode: "2" for an integer, "yes" or 1 for a boolean,
true for a number all pass, where the API server answers `must be of type integer` (and `mpjob
run` trained with them). YAML's .inf and .nan are numbers JSON cannot carry, so kubectl cannot
send them at all. This walks the spec along the generated CRD schema (mpjob.crd, the one the API
server holds) and names each such value; the template's pod fields and a volume's emptyDir take
Kubernetes' own schemas, checked whole where the models read them (mpjob_contract.k8s).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

from mpjob.crd import openapi_schema
from mpjob_contract import formats, k8s

#: Spec fields whose schema is Kubernetes' own (k8s.check types them).
KUBERNETES_TYPED = frozenset({"template", "emptyDir"})
NOT_FINITE = "must be a finite number: JSON, which kubectl sends, has no .inf or .nan"
QUOTED = "write it without quotes"
BOOLEAN = formats.YAML_BOOLEANS


@cache
def _spec_schema() -> dict[str, Any]:
    schema: dict[str, Any] = openapi_schema()["properties"]["spec"]
    return schema


def violations(spec: Any) -> list[k8s.Violation]:
    """Every value below `spec` whose type the API server refuses, and every .inf or .nan."""
    found: list[k8s.Violation] = []
    pending: list[tuple[str, Any, dict[str, Any] | None]] = [("spec", spec, _spec_schema())]
    while pending:
        where, value, schema = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            found.append((where, NOT_FINITE))
        elif schema is not None and (wrong := _wrong_type(value, schema)):
            found.append((where, wrong))
        if isinstance(value, dict):
            for key, item in value.items():
                known = None if key in KUBERNETES_TYPED else _member(schema, key)
                pending.append((f"{where}.{key}", item, known))
        elif isinstance(value, list):
            items = (schema or {}).get("items")
            pending += [(f"{where}[{i}]", item, items) for i, item in enumerate(value)]
    return sorted(found)


def without_nulls(value: Any, schema: dict[str, Any] | None = None) -> Any:
    """`value` (the spec) as the API server stores it: a null where the CRD's schema names a field
    or a map's value (none of them nullable) is dropped, so the field takes its default, as
    `kubectl apply` of `workers: null` gives 1 (a task's args, a template's nodeSelector alike);
    in a list's items too, as the API server's pruning descends along `items` (a null item stays)."""
    schema = _spec_schema() if schema is None else schema
    if isinstance(value, list):
        items = schema.get("items")
        return [without_nulls(item, items) for item in value] if isinstance(items, dict) else value
    if not isinstance(value, dict):
        return value
    kept = {}
    for key, item in value.items():
        known = _member(schema, key)
        if known is None:
            kept[key] = item
        elif item is not None:
            kept[key] = without_nulls(item, known)
    return kept


def _member(schema: dict[str, Any] | None, key: str) -> dict[str, Any] | None:
    """The schema of a mapping's `key`: its property's, else the map's values'
    (additionalProperties); None where the CRD names neither."""
    properties = (schema or {}).get("properties", {})
    below = (schema or {}).get("additionalProperties")
    known: dict[str, Any] | None = properties.get(key, below if isinstance(below, dict) else None)
    return known


def _wrong_type(value: Any, schema: dict[str, Any]) -> str | None:
    """What is wrong with a scalar of a number, boolean or int-or-string field (None: nothing)."""
    if schema.get("x-kubernetes-int-or-string"):
        expected, ok = "an integer or a string", isinstance(value, str) or k8s.is_integer(value)
    elif schema.get("type") == "integer":
        expected, ok = "an integer", k8s.is_integer(value)
    elif schema.get("type") == "number":
        expected, ok = "a number", isinstance(value, int | float) and not isinstance(value, bool)
    elif schema.get("type") == "boolean":
        expected, ok = "a boolean (true or false)", isinstance(value, bool)
    else:
        return None
    if ok or isinstance(value, dict | list) or value is None:  # containers and nulls: the models' to name
        return None
    hint = f" ({BOOLEAN})" if isinstance(value, bool) else f" ({QUOTED})" if _reads_as(value, schema) else ""
    return f"must be {expected}, got {value!r}{hint}"


def _reads_as(value: Any, schema: dict[str, Any]) -> bool:
    """Whether a quoted string would, unquoted, be what the field takes ("2", "0.5", "true")."""
    if not isinstance(value, str):
        return False
    if schema.get("type") == "boolean":
        return value.lower() in ("true", "false")
    try:
        return math.isfinite(float(value))
    except ValueError:
        return False
