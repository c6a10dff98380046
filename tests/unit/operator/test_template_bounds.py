"""The template's volumes and mounts are bounded (mpjob_contract.pod_volumes says why) alike in the
CRD and in `mpjob validate`."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from mpjob.validation import check_text
from mpjob_contract import k8s
from mpjob_contract.pod_volumes import MAX_MOUNT_PATH, MAX_TEMPLATE_VOLUME_MOUNTS, MAX_TEMPLATE_VOLUMES
from tests.unit.operator.cases import bad
from tests.unit.operator.test_rules import crd_schema

pytestmark = pytest.mark.unit


def _problems(manifest: dict[str, Any]) -> list[str]:
    """What `mpjob validate` says of `manifest`, each as `field: message`."""
    return [f"{problem.field}: {problem.message}" for problem in check_text(yaml.safe_dump(manifest))[1]]


def test_volumes_and_mounts_are_bounded_alike_in_the_crd_and_validate() -> None:
    template = crd_schema()["properties"]["spec"]["properties"]["template"]["properties"]
    mount_path = template["volumeMounts"]["items"]["properties"]["mountPath"]
    bounds = (template["volumes"]["maxItems"], template["volumeMounts"]["maxItems"], mount_path["maxLength"])
    assert bounds == (MAX_TEMPLATE_VOLUMES, MAX_TEMPLATE_VOLUME_MOUNTS, MAX_MOUNT_PATH)
    most = [{"name": f"v{i}", "emptyDir": {}} for i in range(MAX_TEMPLATE_VOLUMES)]
    assert _problems(bad("spec.template.volumes", most)) == []
    found = _problems(bad("spec.template.volumes", [*most, {"name": "one-more", "emptyDir": {}}]))
    assert found == [f"spec.template.volumes: must have at most {MAX_TEMPLATE_VOLUMES} items, got 257"]
    volumes = [{"name": "data", "emptyDir": {}}]
    mounts = [{"name": "data", "mountPath": f"/m{i}"} for i in range(MAX_TEMPLATE_VOLUME_MOUNTS)]
    assert _problems(bad("spec.template", {"volumes": volumes, "volumeMounts": mounts})) == []
    longest = [{"name": "data", "mountPath": "/" + "m" * (MAX_MOUNT_PATH - 1)}]
    assert _problems(bad("spec.template", {"volumes": volumes, "volumeMounts": longest})) == []


def test_a_schema_bounds_a_list_by_max_items() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "maxItems": 2}
    assert k8s.check([1, 2], schema, "xs") == []
    assert k8s.check([1, 2, 3], schema, "xs") == [("xs", "must have at most 2 items, got 3")]
