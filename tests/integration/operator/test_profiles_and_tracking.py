"""Where a run goes, through the operator on the test cluster: `kubectl annotate mpj NAME
mpjob.dev/profile-steps=N` profiles the running attempt once (a bounded trace in the job's
checkpoint folder, an entry in status.profiles), bad counts are refused naming the annotation;
spec.tracking.mlflow reaches a real MLflow server from the trainer pods, with the credentials
Secret handed to them as environment."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.launch import CHECKPOINT_MOUNT
from mpjob_contract.tracking import MAX_TRACE_BYTES, PROFILE_ANNOTATION
from tests.helpers import wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator, gpt_spec
from tests.tracking.mlflow_server import mlflow_server, tracking_client

pytestmark = pytest.mark.integration


def annotate(cluster_bin: Path, kubeconfig: str, namespace: str, name: str, value: str) -> None:
    """As a user does it (annotations are not checked by the CRD's schema)."""
    subprocess.run(
        [str(cluster_bin / "kubectl"), "--kubeconfig", kubeconfig, "-n", namespace, "annotate", "mpj", name,
         f"{PROFILE_ANNOTATION}={value}", "--overwrite"],
        check=True, capture_output=True,
    )  # fmt: skip


def warnings(jobs: Jobs, name: str) -> list[str]:
    found = jobs.core.list_namespaced_event(jobs.namespace, field_selector=f"involvedObject.name={name}").items
    return [e.message for e in found if e.reason == "ProfileRefused"]


def profile(jobs: Jobs, name: str, index: int, states: tuple[str, ...]) -> dict[str, Any] | None:
    profiles = jobs.status(name).get("profiles") or []
    return profiles[index] if len(profiles) > index and profiles[index]["state"] in states else None


def test_an_annotation_profiles_the_running_attempt_once_and_bad_counts_are_refused(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str, cluster_bin: Path
) -> None:
    jobs.pvc("ckpt")
    spec = gpt_spec("ckpt", steps=UNTIL_STOPPED, every=50)
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    jobs.create("profiled", spec)
    wait_for(lambda: jobs.status("profiled").get("step", 0) >= 5, 240, message="training under way")

    annotate(cluster_bin, kubeconfig, namespace, "profiled", "0")
    refused = wait_for(lambda: profile(jobs, "profiled", 0, ("Refused",)), 60, message="0 refused")
    said = wait_for(lambda: warnings(jobs, "profiled"), 60, message="a ProfileRefused Event")
    assert f"metadata.annotations[{PROFILE_ANNOTATION}]" in said[0] and "'0'" in said[0]
    assert refused["request"] == "0" and "path" not in refused

    annotate(cluster_bin, kubeconfig, namespace, "profiled", "3")
    taken = wait_for(lambda: profile(jobs, "profiled", 1, ("Captured", "Failed")), 240, message="the profile")
    assert taken["state"] == "Captured", json.dumps(taken)
    uid = jobs.get("profiled")["metadata"]["uid"]
    assert taken["path"] == f"{CHECKPOINT_MOUNT}/{namespace}/profiled/{uid}/profiles/p2/trace.json.gz"
    trace = jobs.checkpoints(kubeconfig, "ckpt", "profiled") / "profiles" / "p2" / "trace.json.gz"
    assert taken["traceBytes"] == trace.stat().st_size <= MAX_TRACE_BYTES
    assert json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert (taken["steps"], taken["attempt"]) == (3, 0) and taken["firstStep"] > 5
    assert 0 < taken["lowPrecisionKernelShare"] <= 1  # bf16 autocast on a CPU: bf16 kernels

    annotate(cluster_bin, kubeconfig, namespace, "profiled", "1000000")
    wait_for(lambda: profile(jobs, "profiled", 2, ("Refused",)), 60, message="10^6 refused")
    wait_for(lambda: any("'1000000'" in m for m in warnings(jobs, "profiled")), 60, message="its Event")
    profiles = jobs.status("profiled")["profiles"]
    assert [p["state"] for p in profiles] == ["Refused", "Captured", "Refused"]  # the capture was not repeated
    assert len(list(trace.parent.parent.iterdir())) == 1
    jobs.patch_spec("profiled", {"runPolicy": {"suspend": True}})
    jobs.wait_phase("profiled", "Suspended", 120)


def test_a_fallback_job_reaches_mlflow_from_its_pods_with_the_secrets_credentials(
    operator: Operator, jobs: Jobs, namespace: str, tmp_path: Path
) -> None:
    jobs.core.create_namespaced_secret(
        namespace, {"metadata": {"name": "mlflow-creds"}, "data": {"token": base64.b64encode(b"t0ken").decode()}}
    )
    jobs.pvc("ckpt")
    with mlflow_server(tmp_path / "mlflow") as uri:
        spec = gpt_spec("ckpt")
        spec["task"]["args"]["overflowAtStep"] = 25
        spec["tracking"] = {"mlflow": {"uri": uri, "experiment": namespace, "credentialsSecret": "mlflow-creds"}}
        jobs.create("tracked", spec)
        status = jobs.wait_phase("tracked", ("Succeeded", "Failed"), 420)
        assert [(a["precision"], a["reason"]) for a in status["attempts"]] == [
            ("fp16", "NumericFault"),
            ("bf16", "Succeeded"),
        ]
        client = tracking_client(uri)
        experiment = client.get_experiment_by_name(namespace)
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id])
        uid = jobs.get("tracked")["metadata"]["uid"]
        (parent,) = [r for r in runs if r.data.tags.get("mpjob.level") == "job"]
        assert parent.data.tags["mpjob.jobKey"] == uid and parent.data.params["precision.ladder"] == "fp16,bf16,fp32"
        attempts = sorted(r.data.tags["mpjob.attempt"] for r in runs if r.data.tags.get("mpjob.level") == "attempt")
        assert attempts == ["0", "1"] and parent.info.status == "FINISHED"
        scale = client.get_metric_history(parent.info.run_id, "loss_scale")
        assert scale and min(m.value for m in scale) < max(m.value for m in scale)
    container = jobs.batch.read_namespaced_job("tracked-a0", namespace).spec.template.spec.containers[0]
    env = {e.name: e for e in container.env}
    token = env["MLFLOW_TRACKING_TOKEN"].value_from.secret_key_ref
    assert (token.name, token.key, token.optional) == ("mlflow-creds", "token", True)
    assert env["MLFLOW_TRACKING_TOKEN"].value is None and "MPJOB_IMAGE" in env
