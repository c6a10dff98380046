"""`mpjob run` of fsdp (FSDP2) jobs on 2 CPU processes through the rest of the ladder: the fp32
replay tells a precision's fault from the data's, a transient fault is re-promoted, the quality
gate falls back from a drifting precision, and bad data is skipped in the same precision, all
on a sharded model resuming from sharded checkpoints. `mixedPrecisionParam: fp32` gathers the
weights in fp32, so the replay and the gate's fp32 pass compute in fp32 (under the default the
replay is skipped: test_sharding.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.localrun import test_fsdp_run as fsdp_run

pytestmark = pytest.mark.unit

FSDP = {"strategy": "fsdp", "fsdp": {"mixedPrecisionParam": "fp32"}}


def mlp(**args: object) -> dict[str, Any]:
    return {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, **args}}


def run_job(tmp: Path, name: str, **spec: Any) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    """test_fsdp_run's job on 2 processes gathering in fp32, 20 steps with a checkpoint every 5."""
    two = {"training": {"steps": 20, "batchSize": 8, "logEvery": 5}, "checkpoint": {"everySteps": 5}}
    two |= {"parallelism": FSDP, "resources": {"gpusPerWorker": 0, "processesPerWorker": 2}}
    return fsdp_run.run_job(tmp, name, **{**two, **spec})


@pytest.mark.process
def test_a_transient_fault_is_replayed_falls_back_and_is_repromoted_sharded(tmp_path: Path) -> None:
    _, report, _ = run_job(
        tmp_path,
        "promote",
        task=mlp(overflowAtStep=15, overflowUntilStep=20),
        training={"steps": 35, "batchSize": 8, "logEvery": 5},
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10},
    )
    ends = [(a["precision"], a["reason"], a["startStep"], a["worldSize"]) for a in report["attempts"]]
    # bf16 runs 15..20 again from the checkpoint before the fault at 20; its 10 clean steps count from 20.
    assert ends == [("fp16", "NumericFault", 0, 2), ("bf16", "Repromote", 15, 2), ("fp16", "Succeeded", 30, 2)]
    assert "finitely" in report["attempts"][0]["message"]  # the replay in fp32 blamed the precision
    assert report["attempts"][2].get("repromoted") is True
    assert report["phase"] == "Succeeded" and report["precision"] == "fp16"


@pytest.mark.process
def test_the_quality_gate_falls_back_from_a_drifting_precision_sharded(tmp_path: Path) -> None:
    _, report, _ = run_job(
        tmp_path,
        "gate",
        task=mlp(samples=256, cancellationOffset=1000),
        training={"steps": 30, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 10},
        precision={"mode": "bf16", "fallback": ["fp32"]},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )
    first, second = report["attempts"]
    assert (first["precision"], first["reason"], first["worldSize"]) == ("bf16", "NumericFault", 2)
    assert "QualityDrift: eval loss" in first["message"] and "in fp32 at the same weights" in first["message"]
    assert (second["precision"], second["reason"]) == ("fp32", "Succeeded")
    assert report["evalLossDelta"] == 0.0 and report["phase"] == "Succeeded"


@pytest.mark.process
def test_a_poisoned_sample_is_skipped_in_the_same_precision_sharded(tmp_path: Path) -> None:
    _, report, _ = run_job(tmp_path, "skip", task=mlp(nonFiniteSamples=[5]), precision={"mode": "fp16"})
    (only,) = report["attempts"]
    assert (only["precision"], only["reason"], only["worldSize"]) == ("fp16", "Succeeded", 2)
    (step,) = report["skipped"]["steps"]
    assert step["cause"] == "data" and step["samples"] == [{"first": 5, "last": 5}]
    assert report["phase"] == "Succeeded" and report["step"] == 20


@pytest.mark.process
def test_arming_the_data_rung_leaves_a_sharded_run_bit_identical(tmp_path: Path) -> None:
    """The rung keeps the state at a fresh start to roll back to; taking it must not touch the
    optimizer (DCP's state dicts would step an optimizer without state once, moving AdamW's
    step count): the shards written at the end equal those of a run without the rung."""
    shards = {}
    for on_bad_data in ("skip", "fail"):
        _, report, out = run_job(
            tmp_path, on_bad_data, task=mlp(), precision={"mode": "bf16", "guard": {"onBadData": on_bad_data}}
        )
        assert report["phase"] == "Succeeded" and report["lastCheckpoint"]["step"] == 20
        manifest = json.loads(next(out.rglob("step-000000020/manifest.json")).read_text())
        shards[on_bad_data] = {
            name: meta["sha256"] for name, meta in manifest["files"].items() if name.endswith(".distcp")
        }
    assert len(shards["skip"]) == 2 and shards["skip"] == shards["fail"]


@pytest.mark.process
def test_an_auto_attempt_sharded_falls_back_in_place_from_the_precision_it_measured(tmp_path: Path) -> None:
    """fp32 made slow: both ranks measure bf16, drift there, and go on in fp32 in their own
    processes, the model wrapped anew (the launch named the changes for each precision)."""
    _, report, out = run_job(
        tmp_path,
        "auto",
        task=mlp(samples=256, cancellationOffset=1000, stepDelay={"fp32": 0.25}),
        training={"steps": 30, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 10},
        precision={"mode": "auto"},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )
    ends = [(a["precision"], a["reason"], a["worldSize"], a.get("inPlace")) for a in report["attempts"]]
    assert ends == [("bf16", "NumericFault", 2, None), ("fp32", "Succeeded", 2, True)], report["attempts"]
    assert report["attempts"][0]["message"].startswith("QualityDrift: ")
    assert sorted(p.name for p in (out / "attempts").iterdir()) == ["a0"]  # no process restarted
