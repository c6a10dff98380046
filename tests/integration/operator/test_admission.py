"""The API server rejects the same manifests as `mpjob validate`, naming the field."""

from __future__ import annotations

import pytest
import yaml
from kubernetes import client

from mpjob.validation import check_text
from tests.unit.operator.cases import CASES, FULL_TEMPLATE, GOOD, bad

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(("manifest", "needle"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_api_server_rejects_with_the_field_named(api_client, crd_installed, namespace, manifest, needle) -> None:
    custom = client.CustomObjectsApi(api_client)
    with pytest.raises(client.rest.ApiException) as caught:
        custom.create_namespaced_custom_object(
            "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest, field_validation="Strict"
        )
    assert caught.value.status in (400, 422)
    assert needle in caught.value.body, caught.value.body


def test_api_server_accepts_and_defaults_a_good_manifest(api_client, crd_installed, namespace) -> None:
    custom = client.CustomObjectsApi(api_client)
    made = custom.create_namespaced_custom_object("mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", GOOD)
    assert made["spec"]["training"]["steps"] == 2000  # structural defaults applied
    assert made["spec"]["precision"]["guard"]["maxConsecutiveOverflows"] == 20


def test_a_full_kubernetes_template_is_stored_as_written(api_client, crd_installed, namespace) -> None:
    """Kubernetes' own schemas admit its pod fields whole: nothing of the template is pruned."""
    custom = client.CustomObjectsApi(api_client)
    manifest = bad("spec.template", FULL_TEMPLATE)
    manifest["metadata"] = {"name": "full-template"}
    made = custom.create_namespaced_custom_object(
        "mpjob.dev", "v1alpha1", namespace, "mixedprecisionjobs", manifest, field_validation="Strict"
    )
    assert made["spec"]["template"] == FULL_TEMPLATE
    jobs, problems = check_text(yaml.safe_dump(manifest))
    assert jobs and not problems, [str(p) for p in problems]
