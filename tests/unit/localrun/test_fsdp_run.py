"""`mpjob run` of jobs with spec.parallelism.strategy: fsdp (FSDP2) on 4 CPU processes (gloo):
it trains sharded to Succeeded, attempts[] shows the world size, and the precision ladder
works on a sharded model, resuming from sharded (torch.distributed.checkpoint) checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import mpjob_run_json

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).with_name("fsdp_script.py")
FSDP = {"strategy": "fsdp"}
GPT = {"nLayer": 2, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000}
#: The ladder's tests: 20 steps, an overflow at 15, a checkpoint every 10.
SHORT = {"steps": 20, "batchSize": 4, "logEvery": 5, "learningRate": 3e-3}


def run_job(tmp: Path, name: str, **spec: Any) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": name}}
    base = {
        "training": {"steps": 30, "batchSize": 4, "logEvery": 5, "learningRate": 3e-3},
        "checkpoint": {"everySteps": 10},
        "parallelism": FSDP,
        "resources": {"gpusPerWorker": 0, "processesPerWorker": 4},
    }
    return mpjob_run_json(tmp / name, {**doc, "spec": {**base, **spec}}, timeout=900)


@pytest.mark.process
def test_a_four_process_fsdp_job_trains_sharded_to_succeeded(tmp_path: Path) -> None:
    _, report, out = run_job(
        tmp_path,
        "fsdp4",
        task={"command": [sys.executable, str(SCRIPT)]},
        precision={"mode": "bf16"},
        parallelism={**FSDP, "activationCheckpointing": "full"},
    )
    (only,) = report["attempts"]
    assert report["phase"] == "Succeeded" and report["step"] == 30
    assert (only["precision"], only["reason"], only["worldSize"]) == ("bf16", "Succeeded", 4)
    log = "\n".join(p.read_text() for p in out.rglob("*.log"))
    assert '"event": "wrap", ' in log and '"strategy": "fsdp"' in log and '"sharded": ["blocks.0.ln_1"' in log
    first, last = (float(v) for v in log.split("losses ")[1].split()[:2])
    assert last < first - 0.2  # it learns


@pytest.mark.process
def test_fp16_overflow_on_a_sharded_model_ends_the_attempt_on_every_rank_and_bf16_finishes(tmp_path: Path) -> None:
    """The ladder's decision under fsdp: all 4 ranks skip the same overflowing steps (found_inf
    agreed over the mesh), the guard ends fp16 at the same step on each, and the bf16 attempt
    finishes. (This script's checkpoints hold no model: the weights' resume is the next test's.)"""
    _, report, _ = run_job(
        tmp_path,
        "fp16",
        task={"command": [sys.executable, str(SCRIPT), "15"]},
        precision={"mode": "fp16"},
        training=SHORT,
    )
    first, second = report["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"], first["worldSize"]) == (
        "fp16",
        "NumericFault",
        42,
        4,
    )
    assert (second["precision"], second["reason"], second["worldSize"]) == ("bf16", "Succeeded", 4)
    assert second["startStep"] == 10 and report["phase"] == "Succeeded"


@pytest.mark.process
def test_fp16_overflow_falls_back_to_bf16_from_a_sharded_checkpoint(tmp_path: Path) -> None:
    _, report, _ = run_job(
        tmp_path,
        "ladder",
        task={"builtin": "gpt", "args": {**GPT, "overflowAtStep": 15}},
        precision={"mode": "fp16"},
        training=SHORT,
    )
    first, second = report["attempts"]
    assert (first["precision"], first["reason"], first["worldSize"]) == ("fp16", "NumericFault", 4)
    assert (second["precision"], second["reason"], second["worldSize"]) == ("bf16", "Succeeded", 4)
    assert second["startStep"] == 10  # the last good sharded checkpoint before the overflow
    assert report["phase"] == "Succeeded" and report["lastCheckpoint"]["step"] == 20


@pytest.mark.process
def test_out_of_memory_then_an_fp32_fallback_keep_the_samples_per_step_sharded(tmp_path: Path) -> None:
    """The ladder's micro-batch splits, unchanged under fsdp (FSDP2 accumulates sharded gradients)."""
    mlp = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 15}}
    mlp["args"]["outOfMemoryAbove"] = 4
    _, report, _ = run_job(
        tmp_path,
        "split",
        task=mlp,
        training={"steps": 20, "batchSize": 8, "logEvery": 5},
        precision={"mode": "fp16", "fallback": ["fp32"]},
    )
    shapes = [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"]) for a in report["attempts"]]
    assert shapes == [("fp16", "OutOfDeviceMemory", 8, 1), ("fp16", "NumericFault", 4, 2), ("fp32", "Succeeded", 2, 4)]
