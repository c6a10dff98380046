"""What `helm template` renders is accepted by a real API server (`kubectl apply
--dry-run=server`): schemas, RBAC objects, hooks, the peering objects, for the value sets a
user picks (cluster-wide, listed namespaces, peering, monitoring off)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from tests.e2e.conftest import CHART, Cli

pytestmark = pytest.mark.e2e


@pytest.fixture
def namespaces(core: client.CoreV1Api) -> Iterator[list[str]]:
    names = [f"mpjob-dry-{uuid.uuid4().hex[:6]}" for _ in range(2)]
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {"mpjob.dev/test": "true"}}})
    yield names
    for name in names:
        core.delete_namespace(name, propagation_policy="Background")


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["watchNamespaces={WATCHED}"],
        ["watchNamespaces={WATCHED}", "peering.enabled=true"],
        ["peering.enabled=true", "metrics.service.enabled=false", "tests.enabled=false"],
    ],
    ids=["cluster-wide", "namespaced", "namespaced-peering", "cluster-wide-peering"],
)
def test_rendered_chart_passes_server_side_dry_run(cli: Cli, namespaces: list[str], sets: list[str]) -> None:
    release_ns, watched = namespaces
    # What `helm install` does first: the CRDs in crds/ (the peering objects need kopf's).
    cli.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    cli.kubectl("wait", "--for=condition=Established", "crd/kopfpeerings.kopf.dev", "crd/clusterkopfpeerings.kopf.dev")
    args = ["template", f"dry-{uuid.uuid4().hex[:4]}", str(CHART), "-n", release_ns]
    for item in sets:
        args += ["--set", item.replace("WATCHED", watched)]
    rendered = cli.helm(*args)
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert {"Deployment", "ServiceAccount"} <= {d["kind"] for d in docs}
    # Pods are admitted only with their ServiceAccount present (as in a real install, where the
    # hook pod comes after the release's objects): create those for real in the throwaway namespace.
    accounts = [d for d in docs if d["kind"] == "ServiceAccount"]
    cli.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(accounts))
    out = cli.kubectl("apply", "--dry-run=server", "-f", "-", stdin=rendered)
    assert out.count("(server dry run)") == len(docs), out
