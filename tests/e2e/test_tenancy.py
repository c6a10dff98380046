"""The tenant boundary on a real API server: the chart's user roles reach people through
Kubernetes' own `edit`/`view`, and its optional ValidatingAdmissionPolicy refuses templates
that reach past the restricted Pod Security profile or name a ServiceAccount off the allowlist.

The policy is bound to this test's namespace only (a label selector), so other tests' jobs
are never judged by it; every cluster-scoped object is removed at the end."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.e2e.conftest import CHART, Cli
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture
def tenant(cli: Cli, core: client.CoreV1Api) -> Iterator[tuple[str, str]]:
    """A labelled namespace, and the chart's roles and policy rendered for it and applied."""
    suffix = uuid.uuid4().hex[:6]
    namespace, release = f"mpjob-tenant-{suffix}", f"ten-{suffix}"
    core.create_namespace({"metadata": {"name": namespace, "labels": {"mpjob.dev/tenancy-test": suffix}}})
    cli.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    rendered = cli.helm(
        "template", release, str(CHART), "-n", namespace,
        "--show-only", "templates/user-roles.yaml", "--show-only", "templates/admission-policy.yaml",
        "--set", "admissionPolicy.enabled=true", "--set", "admissionPolicy.serviceAccountNames={trainer}",
        # --set-string: a suffix of digits only (6 % of them) would otherwise render as a number.
        "--set-string", f"admissionPolicy.namespaceSelector.matchLabels.mpjob\\.dev/tenancy-test={suffix}",
    )  # fmt: skip
    cli.kubectl("apply", "-f", "-", stdin=rendered)
    try:
        yield namespace, release
    finally:
        cli.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=rendered, check=False)
        core.delete_namespace(namespace, propagation_policy="Background")


def job(name: str, **template: Any) -> dict[str, Any]:
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": name},
        "spec": {"task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 0}, "template": template},
    }


def create(cli: Cli, namespace: str, doc: dict[str, Any]) -> tuple[bool, str]:
    """A server-side dry run of creating `doc` (admission runs, nothing is stored): accepted?
    and what kubectl said."""
    argv = [cli.kubectl_bin, "--kubeconfig", cli.kubeconfig, "create", "--dry-run=server", "-n", namespace, "-f", "-"]
    result = subprocess.run(argv, input=json.dumps(doc), capture_output=True, text=True, timeout=60)
    return result.returncode == 0, result.stdout + result.stderr


def can_i(cli: Cli, namespace: str, user: str, verb: str) -> bool:
    out = cli.kubectl("auth", "can-i", verb, "mixedprecisionjobs.mpjob.dev", "-n", namespace, "--as", user, check=False)
    return out.strip() == "yes"


def test_edit_and_view_holders_get_mpjob_rights_through_aggregation(cli: Cli, tenant: tuple[str, str]) -> None:
    namespace, _ = tenant
    for who, role in (("alice", "edit"), ("bob", "view")):
        cli.kubectl("create", "rolebinding", f"{who}-{role}", f"--clusterrole={role}", f"--user={who}", "-n", namespace)
    wait_for(lambda: can_i(cli, namespace, "alice", "create"), 60, message="edit aggregates mpjob-edit")
    wait_for(lambda: can_i(cli, namespace, "bob", "watch"), 60, message="view aggregates mpjob-view")
    assert can_i(cli, namespace, "alice", "delete")
    assert not can_i(cli, namespace, "bob", "create") and not can_i(cli, namespace, "bob", "delete")
    assert not can_i(cli, namespace, "carol", "get"), "no binding, no rights"


def test_admission_policy_keeps_templates_inside_the_restricted_profile(cli: Cli, tenant: tuple[str, str]) -> None:
    namespace, _ = tenant
    host = job("host", volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    # The policy takes effect shortly after it is created: wait until it refuses.
    refused = wait_for(lambda: (r := create(cli, namespace, host)) and not r[0] and r, 60, message="policy active")
    assert "spec.template.volumes" in refused[1] and "restricted" in refused[1]

    ok, out = create(cli, namespace, job("claim", volumes=[{"name": "data", "emptyDir": {}}]))
    assert ok, out
    ok, out = create(cli, namespace, job("plain"))
    assert ok, out
    ok, out = create(cli, namespace, job("borrowed", serviceAccountName="cluster-admin-sa"))
    assert not ok and "spec.template.serviceAccountName: cluster-admin-sa is not allowed" in out
    ok, out = create(cli, namespace, job("allowed", serviceAccountName="trainer"))
    assert ok, out


def test_admission_policy_refuses_an_unconfined_apparmor_annotation(cli: Cli, tenant: tuple[str, str]) -> None:
    """A pod annotation still sets a container's AppArmor profile (the API server copies it into
    the field): the restricted profile, and the baseline one, allow only the runtime's default
    or a profile loaded on the node, so the policy refuses any other at apply time."""
    namespace, _ = tenant
    host = job("host", volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    wait_for(lambda: not create(cli, namespace, host)[0], 60, message="policy active")
    key = "container.apparmor.security.beta.kubernetes.io/trainer"
    ok, out = create(cli, namespace, job("unconfined", annotations={key: "unconfined"}))
    assert not ok and "spec.template.annotations" in out and "AppArmor" in out, out
    for allowed in ("runtime/default", "localhost/trainer-profile"):
        ok, out = create(cli, namespace, job("confined", annotations={key: allowed, "team": "a"}))
        assert ok, out


def test_no_template_hands_a_trainer_a_kubernetes_token(cli: Cli, tenant: tuple[str, str]) -> None:
    """The CRD refuses a projected token or pod certificate before admission (and the policy
    would, for a CRD an upgrade left older: Helm never upgrades crds/); automountServiceAccountToken
    is no template field at all. The policy's rules all type-check against the CRD's schema."""
    namespace, release = tenant
    host = job("host", volumes=[{"name": "root", "hostPath": {"path": "/"}}])
    wait_for(lambda: not create(cli, namespace, host)[0], 60, message="policy active")
    token = {"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
    ok, out = create(cli, namespace, job("token", volumes=[token]))
    assert not ok and "spec.template.volumes[0].projected.sources[0].serviceAccountToken" in out, out
    assert "no Kubernetes credentials" in out
    certificate = {
        "name": "c",
        "projected": {"sources": [{"podCertificate": {"signerName": "x.io/s", "keyType": "ED25519"}}]},
    }
    ok, out = create(cli, namespace, job("certificate", volumes=[certificate]))
    assert not ok and "spec.template.volumes[0].projected.sources[0].podCertificate" in out, out
    ok, out = create(cli, namespace, job("automount", automountServiceAccountToken=True))
    assert not ok and "spec.template.automountServiceAccountToken" in out, out
    projected = {"name": "meta", "projected": {"sources": [{"downwardAPI": {"items": [
        {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}}  # fmt: skip
    ok, out = create(cli, namespace, job("projected", volumes=[projected]))
    assert ok, out
    policy = f"{release}-mpjob-template"

    def checked() -> dict[str, Any] | None:
        raw = cli.kubectl("get", "validatingadmissionpolicy", policy, "-o", "json")
        status = json.loads(raw).get("status") or {}
        return status if "typeChecking" in status else None

    status = wait_for(checked, 60, message="the policy type-checked")
    assert not status["typeChecking"].get("expressionWarnings"), status
