"""`mpjob validate` and the API server agree on every field: each value of a spec that holds every
field (the CRD's defaults and a full template) is replaced, one at a time, by values of the kinds
manifests get wrong (empty, spaced, non-ASCII, too long, out of range, fractional, huge, of another
type), and the server's verdict (a dry-run create, as strict as kubectl's) must be validate's. A rule,
a bound or a format added to one side only is named here with the value and both answers."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from mpjob.validation import check_text
from tests.unit.operator.cases import FULL_TEMPLATE, GOOD, bad

pytestmark = pytest.mark.integration

#: What each field is tried with: not every bound of every field, but every kind of value.
TRIED: list[Any] = [
    "", " ", "a\n", "\uff41", "A" * 64, "x" * 300, "a b", "fp16", "-1",
    0, -1, 1, 99, 257, 2**31, 2**63, 1.5, -0.5, 1e-9, 1e308, True, None, [], {},
]  # fmt: skip


def leaves(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """The path of every scalar below `node`."""
    if isinstance(node, dict | list):
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            yield from leaves(value, (*path, key))
    else:
        yield path


def fields(spec: dict[str, Any]) -> list[tuple[str | int, ...]]:
    """One path of each field below `spec` (of a list's items, the first that has it)."""
    first: dict[tuple[str, ...], tuple[str | int, ...]] = {}
    for path in leaves(spec):
        first.setdefault(tuple("[]" if isinstance(part, int) else part for part in path), path)
    return list(first.values())


def replaced(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(doc)
    node: Any = changed["spec"]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return changed


def server_takes(custom: client.CustomObjectsApi, namespace: str, doc: dict[str, Any]) -> tuple[bool, str]:
    try:
        custom.create_namespaced_custom_object(
            "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", doc, dry_run="All", field_validation="Strict"
        )
    except client.rest.ApiException as exc:
        if exc.status not in (400, 422):
            raise
        return False, str(json.loads(exc.body or "{}").get("message", exc.body))[:200]
    return True, ""


def test_validate_and_the_api_server_agree_on_every_field(
    api_client: client.ApiClient, crd_installed: None, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api_client)
    full = bad("spec.template", FULL_TEMPLATE) | {"metadata": {"name": "parity"}}
    defaulted: Any = custom.create_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", full, dry_run="All"
    )
    base = {**GOOD, "metadata": {"name": "parity"}, "spec": defaulted["spec"]}
    assert server_takes(custom, namespace, base)[0] and check_text(yaml.safe_dump(base))[1] == []
    paths = fields(base["spec"])
    assert {"precision", "training", "checkpoint", "template"} <= {path[0] for path in paths}
    disagree: list[str] = []
    for path in paths:
        for value in TRIED:
            doc = replaced(base, path, value)
            takes, why = server_takes(custom, namespace, doc)
            problems = [str(p) for p in check_text(yaml.safe_dump(doc))[1]]
            if takes is not (problems == []):
                disagree.append(
                    f"{'.'.join(map(str, path))} = {value!r}: server {why or 'takes it'}; validate {problems}"
                )
    assert disagree == [], "\n".join(disagree[:20])
