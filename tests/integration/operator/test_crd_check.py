"""The operator checks the installed CRD as it starts (mpjob.controller.crdcheck), on the real API
server: a CRD older than this release (one spec field fewer) makes it warn, naming the field and
how to apply the CRD, and it still serves its jobs; the shipped CRD draws no warning. The API
server's own behaviour on the older CRD is what the warning says: a strict client is refused the
field, any other loses it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from mpjob_contract import api
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, another_crd
from tests.integration.operator.test_hostile_children import standin

#: The field the older CRD lacks: one no manifest the cluster tests apply sets, so tests running
#: beside this one are not touched by its absence (`older_crd` checks it; training.weightDecay,
#: once this field, is set by the tutorial's manifest, whose strict apply then failed beside it).
MISSING = "gradClipNorm"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def older_crd(api_client: client.ApiClient, crd_installed: None, kubeconfig: str) -> Iterator[None]:
    """The shipped CRD less spec.training's MISSING, for this test; the shipped one again after."""
    applied = (
        *ROOT.glob("examples/**/*.yaml"),
        *ROOT.glob("tests/integration/**/*.py"),
        *ROOT.glob("tests/e2e/**/*.py"),
    )
    setting = [str(p.relative_to(ROOT)) for p in applied if p != Path(__file__) and MISSING in p.read_text()]
    assert not setting, f"{setting} set spec.training.{MISSING}: the older CRD would refuse them beside this test"

    def older(schema: dict[str, Any]) -> None:
        del schema["properties"]["spec"]["properties"]["training"]["properties"][MISSING]

    with another_crd(api_client, kubeconfig, older):
        yield


def _create(custom: client.CustomObjectsApi, namespace: str, name: str, validation: str) -> dict[str, Any]:
    body = {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name}}
    body["spec"] = standin(steps=3, training={MISSING: 0.1})
    created: dict[str, Any] = custom.create_namespaced_custom_object(
        api.GROUP, api.VERSION, namespace, api.PLURAL, body, field_validation=validation
    )
    return created


def test_an_older_crd_draws_a_warning_naming_its_missing_field_and_the_operator_serves_all_the_same(
    older_crd: None, api_client: client.ApiClient, namespace: str, kubeconfig: str, tmp_path: Path
) -> None:
    custom = client.CustomObjectsApi(api_client)

    def strict_refused() -> bool:  # until the API server validates with the older CRD
        try:
            _create(custom, namespace, "strict", "Strict")
        except client.ApiException as exc:
            return exc.status == 400 and f'unknown field \\"spec.training.{MISSING}\\"' in str(exc.body)
        custom.delete_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "strict")
        return False

    wait_for(strict_refused, 30, interval=0.5, message="a strict create refused under the older CRD")
    pruned = _create(custom, namespace, "pruned", "Ignore")
    assert MISSING not in pruned["spec"].get("training", {}), "the older CRD pruned the field"

    operator = Operator(kubeconfig, namespace, tmp_path / "operator.log")
    operator.start()
    try:
        jobs = Jobs(api_client, namespace)
        assert jobs.wait_phase("pruned", ("Succeeded", "Failed"), 180)["phase"] == "Succeeded"
        log = operator.log.read_text()
        warning = next(line for line in log.splitlines() if "older than this operator" in line)
        assert " WARNING mpjob.operator " in warning
        assert f"it lacks spec.training.{MISSING}" in warning
        assert "kubectl apply --server-side --force-conflicts -f crds/mixedprecisionjobs.mpjob.dev.yaml" in warning
        assert operator.proc is not None and operator.proc.poll() is None, "the operator exited"
    finally:
        operator.stop()


def test_the_shipped_crd_draws_no_warning(shipped_crd: None, kubeconfig: str) -> None:
    """In a process of its own: the client reads $KUBECONFIG when it is imported."""
    check = "from mpjob.controller import crdcheck; print(crdcheck.at_start())"
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "None"
    assert "mpjob.operator" not in done.stderr and "CustomResourceDefinition" not in done.stderr, done.stderr
