"""An admin upgrades the operator while jobs run, on the real control plane: the operator stops
(a rollout's SIGTERM) mid-attempt, the chart's CRD is applied again, a new operator starts. The
running attempt is neither made twice nor forgotten, `kubectl get mpj` shows its columns, and a
job stored under an older CRD (without the fields that now have defaults) is served as written."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from mpjob.controller import crdcheck
from tests.cluster.controlplane import binaries
from tests.helpers import wait_for
from tests.integration.operator.conftest import CRD, Jobs, Operator, another_crd, crd_lock, install_crd
from tests.integration.operator.test_crd_check import MISSING
from tests.integration.operator.test_hostile_children import condition, standin

pytestmark = pytest.mark.integration

CHART_CRD = Path(__file__).resolve().parents[3] / "helm/mpjob/crds/mixedprecisionjobs.mpjob.dev.yaml"


def columns(kubeconfig: str, namespace: str, name: str) -> dict[str, str]:
    """`kubectl get mpj NAME`'s columns by their heading."""
    argv = [str(binaries() / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace, "get", "mpj", name]
    heading, row = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", heading)]  # kubectl aligns each column under its heading
    ends = [*starts[1:], None]
    return {heading[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def test_an_operator_upgraded_mid_attempt_with_the_chart_s_crd_goes_on_with_the_same_attempt(
    operator: Operator, jobs: Jobs, api_client: client.ApiClient, kubeconfig: str, namespace: str
) -> None:
    jobs.create("upgraded", standin(steps=30))
    jobs.wait_status("upgraded", lambda s: s.get("step", 0) >= 3, 60, "the attempt past step 3")
    operator.stop()
    with crd_lock(kubeconfig):
        install_crd(api_client, yaml.safe_load(CHART_CRD.read_text()))
    seen = jobs.status("upgraded")["step"]
    operator.start()
    moving = jobs.wait_status("upgraded", lambda s: s.get("step", 0) > seen, 60, "the step read again")
    shown = columns(kubeconfig, namespace, "upgraded")
    assert (shown["PHASE"], shown["PRECISION"], shown["ATTEMPT"], shown["WORKERS"]) == ("Running", "bf16", "0", "1")
    assert int(shown["STEP"]) >= moving["step"], shown
    status = jobs.wait_phase("upgraded", ("Succeeded", "Failed"), 60)
    assert status["phase"] == "Succeeded" and [a["index"] for a in status["attempts"]] == [0], status
    assert status["attemptCounts"]["started"] == 1 and jobs.attempt_jobs("upgraded") == ["upgraded-a0"]
    started = [e for e in jobs.events("upgraded", "AttemptStarted") if e.reason == "AttemptStarted"]
    assert len(started) == 1 and (started[0].count or 1) == 1, [(e.message, e.count) for e in started]
    shown = columns(kubeconfig, namespace, "upgraded")
    assert (shown["PHASE"], shown["STEP"], shown["ATTEMPT"]) == ("Succeeded", "30", "0"), shown


def test_the_upgrade_s_crd_command_applies_over_a_crd_helm_installed(
    api_client: client.ApiClient, kubeconfig: str
) -> None:
    """Before, the command the docs and the operator's warning gave was refused (`Apply failed
    with 1 conflict: conflict with "helm" ... .spec.versions`): helm owns the fields of the CRD it
    installed, and the older CRD stayed."""
    older = yaml.safe_load(CRD.read_text())
    del older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["training"][
        "properties"
    ][MISSING]
    kubectl = [str(binaries() / "kubectl"), "--kubeconfig", kubeconfig]
    with crd_lock(kubeconfig):
        try:  # the older release's CRD as `helm install` leaves it: every field helm's
            subprocess.run(
                [*kubectl, "replace", "--field-manager=helm", "-f", "-"],
                input=yaml.safe_dump(older), capture_output=True, text=True, check=True, timeout=60,
            )  # fmt: skip
            applied = subprocess.run(
                [*kubectl, *crdcheck.APPLY, "-f", str(CHART_CRD.parent)], capture_output=True, text=True, timeout=60
            )
            assert applied.returncode == 0, applied.stderr
            installed = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(crdcheck.NAME)
            assert crdcheck.problems(api_client.sanitize_for_serialization(installed)) == []
        finally:
            install_crd(api_client, yaml.safe_load(CRD.read_text()))


def _without_defaults(schema: dict[str, Any]) -> None:
    """An older CRD: the spec's fields carry no default (nor the rules, which may name them), so
    a job stored under it holds none of them. The fields stay in its schema: a field it lacked
    would be pruned from every job read while it is installed, and a job another test runs
    meanwhile, on another worker, read without the value it set (a bucket's credentialsSecret
    once: its operator named the wrong field)."""

    def strip(node: Any, keys: tuple[str, ...] = ()) -> None:
        """`keys`: a list-map's keys, whose defaults the API server requires."""
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            for name, field in (node.get("properties") or {}).items():
                if isinstance(field, dict) and name not in keys:
                    field.pop("default", None)
            for name, value in node.items():
                strip(value, tuple(node.get("x-kubernetes-list-map-keys") or ()) if name == "items" else ())
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(schema["properties"]["spec"])


def test_a_job_stored_under_an_older_crd_runs_under_the_new_one(
    api_client: client.ApiClient, kubeconfig: str, jobs: Jobs, operator: Operator
) -> None:
    with another_crd(api_client, kubeconfig, _without_defaults):
        jobs.create("older", standin(steps=4))
    # The new CRD's defaults, filled in as the object is read from storage, once the API server
    # serves the new CRD (a moment after it is installed).
    wait_for(lambda: (jobs.get("older")["spec"].get("precision") or {}).get("inPlace") is True, 30, message="defaults")
    status = jobs.wait_phase("older", ("Succeeded", "Failed"), 60)
    assert status["phase"] == "Succeeded" and condition(status, "Succeeded")["status"] == "True", status
    assert wait_for(lambda: jobs.attempt_jobs("older") == ["older-a0"], 10, message="one attempt Job")
