"""What `helm template` renders is accepted by a real API server (`kubectl apply
--dry-run=server`): schemas, RBAC objects, hooks, the peering objects, for the value sets a
user picks (cluster-wide, listed namespaces, peering, monitoring off), and with every
monitoring object on against the Prometheus Operator's own CRDs."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from tests.e2e.conftest import CHART, REPO, Cli

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
    dry_run(cli, namespaces, sets)


MONITORING_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")


def test_monitoring_objects_pass_server_side_dry_run_against_the_prometheus_operator_crds(
    cli: Cli, namespaces: list[str]
) -> None:
    """ServiceMonitor, PodMonitor, PrometheusRule and the dashboard ConfigMaps, all enabled, are
    valid against the pinned Prometheus Operator CRDs (the schemas a monitoring stack installs)."""
    source = subprocess.run(
        ["bash", str(REPO / "tests/cluster/monitoring-crds.sh")], capture_output=True, text=True, check=True
    ).stdout.strip()
    for name in MONITORING_CRDS:
        cli.kubectl("apply", "--server-side", "--force-conflicts", "-f", f"{source}/monitoring.coreos.com_{name}.yaml")
    cli.kubectl("wait", "--for=condition=Established", *(f"crd/{n}.monitoring.coreos.com" for n in MONITORING_CRDS))
    docs = dry_run(
        cli,
        namespaces,
        [
            "monitoring.prometheusRule.enabled=true",
            "monitoring.dashboards.enabled=true",
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.podMonitor.enabled=true",
        ],
    )
    kinds = [d["kind"] for d in docs]
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= set(kinds)
    assert kinds.count("ConfigMap") >= 3, "one dashboard ConfigMap per dashboard"


def dry_run(cli: Cli, namespaces: list[str], sets: list[str]) -> list[dict]:
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
    return docs
