"""`mpjob run` through the smarter fallback: a fault that fp32 replays too fails after one
attempt; running out of GPU memory and a fallback into fp32 split the micro-batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit


#: The replay's verdict ends the attempt (the data rung's skipping: test_data_rung.py).
FAIL_ON_BAD_DATA = {"mode": "fp16", "guard": {"onBadData": "fail"}}


def mlp(**args: object) -> dict:
    return {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, **args}}


def run(tmp: Path, **spec: object) -> tuple[int, dict, str]:
    job = manifest(tmp, **{"training": {"steps": 40, "batchSize": 8, "logEvery": 5}, **spec})
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain")
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


@pytest.mark.process
def test_poisoned_data_fails_after_one_attempt_with_the_replays_verdict(tmp_path: Path) -> None:
    code, report, out = run(tmp_path, task=mlp(nonFiniteSamples=[5, 40]), precision=FAIL_ON_BAD_DATA)
    assert code == 1 and report["phase"] == "Failed", out
    (only,) = report["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NonFiniteInFp32", 45)
    assert "is non-finite too" in only["message"]
    failed = next(c for c in report["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "NonFiniteInFp32"


@pytest.mark.process
def test_out_of_memory_then_an_fp32_fallback_keep_the_samples_per_step(tmp_path: Path) -> None:
    code, report, out = run(
        tmp_path, task=mlp(overflowAtStep=15, outOfMemoryAbove=4), precision={"mode": "fp16", "fallback": ["fp32"]}
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    shapes = [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"]) for a in report["attempts"]]
    assert shapes == [("fp16", "OutOfDeviceMemory", 8, 1), ("fp16", "NumericFault", 4, 2), ("fp32", "Succeeded", 2, 4)]
    assert "fp32 replayed steps 13-16 finitely" in report["attempts"][1]["message"]  # counted from 1


@pytest.mark.process
def test_with_fallback_keeps_batch_off_fp32_runs_the_spec_micro_batch(tmp_path: Path) -> None:
    code, report, out = run(
        tmp_path,
        task=mlp(overflowAtStep=15),
        precision={"mode": "fp16", "fallback": ["fp32"], "fallbackKeepsBatch": False},
    )
    assert code == 0, out
    assert [(a["microBatch"], a["gradAccumulation"]) for a in report["attempts"]] == [(8, 1), (8, 1)]


@pytest.mark.process
def test_two_workers_agree_on_the_replays_verdict(tmp_path: Path) -> None:
    """Each rank replays its own share of the steps; the verdict is all-reduced, so both end
    NonFiniteInFp32 even though only one rank's samples hold the poisoned one."""
    code, report, out = run(tmp_path, workers=2, task=mlp(nonFiniteSamples=[5]), precision=FAIL_ON_BAD_DATA)
    assert code == 1 and report["phase"] == "Failed", out
    (only,) = report["attempts"]
    assert (only["reason"], only["worldSize"]) == ("NonFiniteInFp32", 2)
    reports = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").rglob("termination-worker*.json"))]
    assert [r["reason"] for r in reports] == ["NonFiniteInFp32", "NonFiniteInFp32"]
    assert {r["replay"]["offendingStep"] for r in reports} == {reports[0]["replay"]["offendingStep"]}
    assert 5 in reports[0]["replay"]["samples"] + reports[1]["replay"]["samples"]


def promotion(tmp: Path, until: int) -> tuple[int, dict, str]:
    """fp16 overflows from step 15 until `until`; bf16 takes over from the checkpoint before the
    fault; 10 clean steps after the step that faulted (and a checkpoint: every 5) the job goes
    back up to fp16."""
    return run(
        tmp,
        task=mlp(overflowAtStep=15, overflowUntilStep=until),
        training={"steps": 60, "batchSize": 8, "logEvery": 5},
        checkpoint={"everySteps": 5},
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 10},
    )


@pytest.mark.process
def test_a_transient_fault_falls_back_then_repromotes_and_finishes_in_fp16(tmp_path: Path) -> None:
    code, report, out = promotion(tmp_path, until=20)
    assert code == 0 and report["phase"] == "Succeeded", out
    ends = [(a["precision"], a["reason"], a["startStep"], a.get("repromoted")) for a in report["attempts"]]
    assert ends == [("fp16", "NumericFault", 0, None), ("bf16", "Repromote", 15, None), ("fp16", "Succeeded", 30, True)]
    assert report["attempts"][0]["endStep"] == 20  # bf16 ran 15..20 again before its clean steps began
    assert report["precision"] == "fp16", report
    assert "precision re-promotion: bf16 -> fp16 (Repromote), resuming from checkpoint step 30" in out
    fallback = next(c for c in report["conditions"] if c["type"] == "PrecisionFallback")
    assert (fallback["status"], fallback["reason"]) == ("False", "Repromoted")


@pytest.mark.process
def test_a_repromotion_out_of_fp32s_split_takes_the_full_micro_batch_back(tmp_path: Path) -> None:
    """fp16 -> fp32 (fallbackKeepsBatch: 16 x 1 split to 8 x 2) -> fp16: the re-promoted attempt
    trains 16 x 1 again, not fp32's split, for the rest of the run."""
    code, report, out = run(
        tmp_path,
        task=mlp(overflowAtStep=15, overflowUntilStep=20),
        training={"steps": 40, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 5},
        precision={"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 10},
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    shapes = [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"]) for a in report["attempts"]]
    assert shapes == [("fp16", "NumericFault", 16, 1), ("fp32", "Repromote", 8, 2), ("fp16", "Succeeded", 16, 1)]
    assert "attempt 2: fp16 micro-batch 16 x 1" in out


@pytest.mark.process
def test_a_precision_that_faults_again_after_repromotion_stays_down(tmp_path: Path) -> None:
    code, report, out = promotion(tmp_path, until=40)  # still overflowing when fp16 comes back at 30
    assert code == 0 and report["phase"] == "Succeeded", out
    assert [(a["precision"], a["reason"]) for a in report["attempts"]] == [
        ("fp16", "NumericFault"),
        ("bf16", "Repromote"),
        ("fp16", "NumericFault"),
        ("bf16", "Succeeded"),  # fp16 is not tried a third time
    ]


@pytest.mark.process
def test_the_quality_gate_falls_back_from_a_drifting_precision_and_shows_it(tmp_path: Path) -> None:
    code, report, out = run(
        tmp_path,
        task=mlp(samples=256, cancellationOffset=1000),
        training={"steps": 60, "batchSize": 16, "logEvery": 5},
        precision={"mode": "bf16", "fallback": ["fp32"]},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    first, second = report["attempts"]
    assert (first["precision"], first["reason"]) == ("bf16", "NumericFault")
    assert first["message"].startswith("QualityDrift: ") and second["precision"] == "fp32"
    assert report["evalLossDelta"] == 0.0 and report["evalLoss"] > 0  # fp32's own evaluation
    series = json.loads((tmp_path / "out" / "series.json").read_text())
    assert {e["attempt"] for e in series["evals"]} == {0, 1}
