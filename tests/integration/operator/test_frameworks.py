"""A Hugging Face Trainer script on the real control plane: the operator runs
examples/hf-trainer/train.py under the launcher; its fp16 attempt overflows, and the next
attempt resumes in bf16 through Trainer.train(resume_from_checkpoint=...) from the Trainer's
own checkpoint, adopted by mpjob and named by the first attempt's report."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integration.operator.conftest import Jobs, Operator, pod_events

pytestmark = pytest.mark.integration

HF_TRAINER = Path(__file__).resolve().parents[3] / "examples" / "hf-trainer" / "train.py"


def test_hf_trainer_falls_back_from_fp16_to_bf16_from_its_own_checkpoint(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    small = ["--layers", "1", "--embd", "32", "--samples", "512"]
    jobs.create(
        "hf",
        {
            "task": {"command": [sys.executable, str(HF_TRAINER), *small, "--overflow-at", "25"]},
            "training": {"steps": 40, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "checkpoint": {"everySteps": 10, "volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}},
            "resources": {"gpusPerWorker": 0},
        },
    )
    status = jobs.wait_phase("hf", ("Succeeded", "Failed"), 240)
    assert status["phase"] == "Succeeded", status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"], second["startStep"]) == ("bf16", "Succeeded", 20)
    assert status["lastCheckpoint"]["step"] == 40 and status["lastCheckpoint"]["precision"] == "bf16"

    (resumed,) = [e for e in pod_events(kubeconfig, namespace, "hf-a1") if e["event"] == "resume"]
    assert resumed["step"] == 20 and resumed["fromPrecision"] == "fp16"
    volume = jobs.checkpoints(kubeconfig, "ckpt", "hf")
    adopted = volume / Path(resumed["path"]).name
    files = json.loads((adopted / "manifest.json").read_text())["files"]
    assert {"framework/model.safetensors", "framework/optimizer.pt", "framework/trainer_state.json"} <= set(files)
