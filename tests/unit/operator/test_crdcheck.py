"""The installed CRD against this release's (mpjob.controller.crdcheck): what the API server
would prune is named, a newer CRD passes, and the warning says how to apply the CRD."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import pytest

from mpjob.controller import crdcheck
from mpjob.crd import crd


def _schema(doc: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def _older() -> dict[str, Any]:
    """This release's CRD less two spec fields added since an older release."""
    doc = crd()
    props = _schema(doc)["properties"]
    del props["spec"]["properties"]["runPolicy"]["properties"]["progressDeadlineSeconds"]
    del props["spec"]["properties"]["precision"]["properties"]["inPlace"]
    return doc


def test_this_releases_crd_fits() -> None:
    assert crdcheck.problems(crd()) == []


def test_an_older_crd_names_each_field_it_would_prune() -> None:
    found = crdcheck.problems(_older())
    assert found == ["it lacks spec.precision.inPlace, spec.runPolicy.progressDeadlineSeconds"]
    said = crdcheck.outdated(crdcheck.NAME, found)
    assert "spec.runPolicy.progressDeadlineSeconds" in said
    assert "kubectl apply --server-side --force-conflicts -f crds/mixedprecisionjobs.mpjob.dev.yaml" in said


def test_the_status_keeps_unknown_fields_so_no_status_field_is_ever_missing() -> None:
    doc = crd()
    _schema(doc)["properties"]["status"]["properties"] = {}
    assert crdcheck.problems(doc) == []


def test_a_newer_crd_passes() -> None:
    doc = crd()
    _schema(doc)["properties"]["spec"]["properties"]["fromANewerRelease"] = {"type": "string"}
    assert crdcheck.problems(doc) == []


def test_where_the_installed_schema_keeps_unknown_fields_nothing_is_missing() -> None:
    doc = _older()
    run_policy = _schema(doc)["properties"]["spec"]["properties"]["runPolicy"]
    run_policy.clear()
    run_policy.update({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
    assert crdcheck.problems(doc) == ["it lacks spec.precision.inPlace"]


def test_a_list_or_a_map_without_its_members_schema_is_missing() -> None:
    expected = {"properties": {"a": {"items": {"properties": {"x": {}}}}, "m": {"additionalProperties": {}}}}
    installed = {"properties": {"a": {"type": "array"}, "m": {"type": "object"}}}
    assert crdcheck.missing_fields(expected, installed) == ["a[]", "m{}"]


def test_many_missing_fields_are_counted_past_the_first_few() -> None:
    doc = crd()
    _schema(doc)["properties"]["spec"]["properties"] = {}
    (found,) = crdcheck.problems(doc)
    named = found.removeprefix("it lacks ").split(" and ")[0].split(", ")
    assert len(named) == crdcheck.NAMED and all(n.startswith("spec.") for n in named)
    assert found.endswith(" more") and " and " in found


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda v: v.update(served=False), "it does not serve version v1alpha1"),
        (lambda v: v.update(name="v1alpha0"), "it does not serve version v1alpha1"),
        (lambda v: v.pop("subresources"), "it has no status subresource"),
    ],
)
def test_a_crd_that_does_not_serve_this_version_with_its_status_is_refused(change: Any, said: str) -> None:
    doc = deepcopy(crd())
    change(doc["spec"]["versions"][0])
    assert said in crdcheck.problems(doc)
