"""Sharded training (spec.parallelism.strategy: fsdp) on the real control plane: 2 workers x 2
processes, FSDP2 across the 4 processes of the attempt's pods; an fp16 overflow falls back to
bf16 from the last good sharded (DCP) checkpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator, pod_events

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "tests" / "unit" / "localrun" / "fsdp_script.py"
EXAMPLE = REPO / "examples" / "fsdp" / "train.py"


def fsdp_spec(claim: str, command: list[str], **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "workers": 2,
        "task": {"command": [sys.executable, *command]},
        "training": {"steps": 20, "batchSize": 4, "logEvery": 5, "seed": 0},
        "precision": {"mode": "bf16", "fallback": ["fp32"]},
        "parallelism": {"strategy": "fsdp", "activationCheckpointing": "selective"},
        "checkpoint": {"everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": claim}}},
        "resources": {"gpusPerWorker": 0, "processesPerWorker": 2},
    }
    spec.update(over)
    return spec


def test_two_workers_of_two_processes_train_one_sharded_model(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    jobs.create("shard", fsdp_spec("ckpt", [str(SCRIPT)]))
    status = jobs.wait_phase("shard", ("Succeeded", "Failed"), 420)
    assert status["phase"] == "Succeeded", status
    (only,) = status["attempts"]
    assert (only["precision"], only["reason"], only["worldSize"]) == ("bf16", "Succeeded", 4)
    wrapped = wait_for(
        lambda: [e for e in pod_events(kubeconfig, namespace, "shard-a0") if e["event"] == "wrap"],
        60,
        message="the trainer's wrap event",
    )
    assert wrapped[0]["strategy"] == "fsdp" and wrapped[0]["sharded"][-1] == ""  # blocks, then the root
    assert wrapped[0]["checkpointedBlocks"] == [0]  # selective, every 2nd of the 2 blocks


def test_an_fsdp_job_falls_back_from_fp16_to_bf16_from_a_sharded_checkpoint(operator: Operator, jobs: Jobs) -> None:
    jobs.pvc("ckpt")
    spec = fsdp_spec("ckpt", [str(EXAMPLE), "--layers", "2", "--overflow-at", "15"])
    spec["precision"] = {"mode": "fp16", "fallback": ["bf16", "fp32"]}
    jobs.create("ladder", spec)
    status = jobs.wait_phase("ladder", ("Succeeded", "Failed"), 600)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["worldSize"]) == ("fp16", "NumericFault", 4)
    assert (second["precision"], second["reason"], second["worldSize"]) == ("bf16", "Succeeded", 4)
    assert second["startStep"] == 10
