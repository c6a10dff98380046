"""`mpjob run` through the fp8 rung (emulated on the CPU): a drift in fp8 only trips the quality
gate and the job goes on in bf16 from the last good checkpoint; a transient one comes back to
fp8 after precision.repromoteAfterSteps; fp8 without fp8 hardware fails at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit

FP8 = {"mode": "fp8", "fallback": ["bf16", "fp32"], "fp8": {"emulate": True}}


def run(tmp: Path, *, precision: dict, **args: object) -> tuple[int, dict, str]:
    job = manifest(
        tmp,
        task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, **args}},
        training={"steps": 60, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 5},
        precision=precision,
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain", timeout=600)
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


@pytest.mark.process
def test_an_fp8_only_drift_falls_back_to_bf16_from_the_last_good_checkpoint(tmp_path: Path) -> None:
    code, report, out = run(tmp_path, precision=FP8, fp8OutlierAtStep=15)
    assert code == 0 and report["phase"] == "Succeeded", out
    first, second = report["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp8", "NumericFault", 42)
    assert first["message"].startswith("QualityDrift: ")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert second["startStep"] < first["endStep"] and second["startStep"] % 5 == 0  # a checkpoint before the fault
    assert report["precision"] == "bf16" and report["step"] == 60
    fallback = next(c for c in report["conditions"] if c["type"] == "PrecisionFallback")
    assert fallback["status"] == "True" and "fp8" in fallback["message"] and "bf16" in fallback["message"]


@pytest.mark.process
def test_a_transient_fp8_drift_comes_back_to_fp8(tmp_path: Path) -> None:
    code, report, out = run(
        tmp_path, precision={**FP8, "repromoteAfterSteps": 10}, fp8OutlierAtStep=15, fp8OutlierUntilStep=35
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    ends = [(a["precision"], a["reason"], a.get("repromoted")) for a in report["attempts"]]
    assert ends == [("fp8", "NumericFault", None), ("bf16", "Repromote", None), ("fp8", "Succeeded", True)]
    assert report["precision"] == "fp8" and "precision re-promotion: bf16 -> fp8" in out


@pytest.mark.process
def test_fp8_without_fp8_hardware_fails_at_the_first_attempt_naming_the_device(tmp_path: Path) -> None:
    code, report, out = run(tmp_path, precision={"mode": "fp8"})
    assert code == 1 and report["phase"] == "Failed", out
    (only,) = report["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp8", "ConfigError", 43)
    assert "this process runs on cpu" in only["message"] and "precision.fp8.emulate" in only["message"]


@pytest.mark.process
def test_the_fp8_example_tells_the_story_it_promises(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "examples" / "fp8-fallback.yaml"
    result = mpjob_run(str(example), "--out", str(tmp_path / "out"), "--plain", timeout=600)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert result.returncode == 0 and report["phase"] == "Succeeded", result.stdout + result.stderr
    assert [(a["precision"], a["reason"]) for a in report["attempts"]] == [
        ("fp8", "NumericFault"),
        ("bf16", "Succeeded"),
    ]
    assert report["attempts"][0]["message"].startswith("QualityDrift: ")
