"""`mpjob run` of an `auto` job with precision.inPlace: the first attempt measures bf16 on this
machine (fp32 made slow), the quality gate then finds bf16 drifting, and the attempt falls back
to fp32 in its own trainer process, as an attempt launched in bf16 does: the launch named the
changes for each precision it might measure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.localrun.test_smarter_fallback import mlp, run

pytestmark = pytest.mark.unit


def drifting_auto(tmp: Path, *, in_place: bool) -> tuple[int, dict, str]:
    return run(
        tmp,
        task=mlp(samples=256, cancellationOffset=1000, stepDelay={"fp32": 0.25}),
        training={"steps": 30, "batchSize": 16, "logEvery": 5},
        precision={"mode": "auto", "inPlace": in_place},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
    )


@pytest.mark.process
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "restart"])
def test_an_auto_attempt_that_measured_bf16_falls_back_in_place(tmp_path: Path, in_place: bool) -> None:
    code, report, out = drifting_auto(tmp_path, in_place=in_place)
    assert code == 0 and report["phase"] == "Succeeded", out
    first, second = report["attempts"]
    assert (first["precision"], first["reason"]) == ("bf16", "NumericFault"), first
    assert first["message"].startswith("QualityDrift: ") and second["precision"] == "fp32"
    assert first["measuredStepSeconds"]["fp32"] > 0.25 > first["measuredStepSeconds"]["bf16"]
    assert second.get("inPlace") is (True if in_place else None)
    processes = sorted(p.name for p in (tmp_path / "out" / "attempts").iterdir())
    assert processes == (["a0"] if in_place else ["a0", "a1"])  # in place: one trainer process


@pytest.mark.process
def test_an_auto_attempt_that_measured_fp32_splits_its_micro_batch_in_place(tmp_path: Path) -> None:
    """bf16 made slow: fp32 is measured, and running out of memory at step 15 goes on in fp32's
    next split in the same process, from the checkpoint at step 10."""
    code, report, out = run(
        tmp_path,
        task=mlp(samples=256, stepDelay={"bf16": 0.25}, outOfMemoryAbove=4, outOfMemoryFromStep=15),
        training={"steps": 30, "batchSize": 8, "logEvery": 5},
        precision={"mode": "auto"},
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    shapes = [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"], a["startStep"], a.get("inPlace"))
              for a in report["attempts"]]  # fmt: skip
    assert shapes == [("fp32", "OutOfDeviceMemory", 8, 1, 0, None), ("fp32", "Succeeded", 4, 2, 10, True)], out
    assert sorted(p.name for p in (tmp_path / "out" / "attempts").iterdir()) == ["a0"]
