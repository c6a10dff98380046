"""Your own training code on the real control plane: examples/own-loop/train.py (a plain
PyTorch script on the SDK) under the launcher in every pod, several processes per pod."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.launch import job_checkpoint_dir
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, pod_events

pytestmark = pytest.mark.integration

OWN_LOOP = Path(__file__).resolve().parents[3] / "examples" / "own-loop" / "train.py"


def own_loop_spec(claim: str, *script_args: str, steps: int, every: int, **over: Any) -> dict[str, Any]:
    small = ["--samples", "1024", "--hidden", "32", "--loader-workers", "1"]
    spec: dict[str, Any] = {
        "task": {"command": [sys.executable, str(OWN_LOOP), *small, *script_args]},
        "training": {"steps": steps, "logEvery": 5, "seed": 0},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": every, "volume": {"persistentVolumeClaim": {"claimName": claim}}},
        "resources": {"gpusPerWorker": 0},
    }
    spec.update(over)
    return spec


def test_own_loop_falls_back_from_fp16_to_bf16_and_succeeds(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    jobs.create("own", own_loop_spec("ckpt", "--overflow-at", "25", steps=50, every=10))
    status = jobs.wait_phase("own", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert first["worldSize"] == 1
    assert "MaxNonFiniteLosses" in first["message"] or "MaxConsecutiveOverflows" in first["message"]
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert second["startStep"] == 20  # the last good checkpoint before the overflow at 25
    assert status["lastCheckpoint"]["step"] == 50 and status["lastCheckpoint"]["precision"] == "bf16"
    # The report names the checkpoint as the pod saw it (on the volume), so the next attempt was
    # told to resume from exactly that one.
    folder = job_checkpoint_dir(namespace=jobs.namespace, name="own", uid=jobs.get("own")["metadata"]["uid"])
    assert status["lastCheckpoint"]["path"] == f"{folder}/step-000000050"  # in the job's own folder


def test_two_workers_of_two_processes_train_with_world_size_four_and_resume_after_a_deleted_pod(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = own_loop_spec("ckpt", steps=100000, every=10, workers=2)
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    spec["resources"]["processesPerWorker"] = 2
    jobs.create("wide", spec)
    started = wait_for(
        lambda: [e for e in pod_events(kubeconfig, namespace, "wide-a0") if e["event"] == "start"],
        180,
        message="the trainer's start event",
    )
    assert started[0]["worldSize"] == 4
    assert jobs.status("wide")["attempts"][0]["worldSize"] == 4
    volume = jobs.checkpoints(kubeconfig, "ckpt", "wide")
    wait_for(lambda: list(volume.glob("step-*/manifest.json")), 180, message="a checkpoint")
    pods = jobs.core.list_namespaced_pod(namespace, label_selector="mpjob.dev/job=wide,mpjob.dev/attempt=0")
    assert len(pods.items) == 2
    jobs.core.delete_namespaced_pod(pods.items[1].metadata.name, namespace)
    status = wait_for(
        lambda: len((s := jobs.status("wide")).get("attempts", [])) == 2 and s, 120, message="second attempt"
    )
    first, second = status["attempts"]
    assert first["reason"] in ("Preempted", "PodDeleted", "InfraError"), first
    assert (second["precision"], second["worldSize"]) == ("bf16", 4)
    resumed = wait_for(
        lambda: [e for e in pod_events(kubeconfig, namespace, "wide-a1") if e["event"] == "resume"],
        180,
        message="attempt 1 resumed from a checkpoint",
    )
    assert resumed[0]["step"] >= 10
    jobs.patch_spec("wide", {"runPolicy": {"suspend": True}})  # stop the long run quickly
    jobs.wait_phase("wide", "Suspended", 90)
