"""`mpjob run` with precision.inPlace: running out of device memory goes on in the same trainer
process in the smaller micro-batch a restart would have started, recorded as that attempt
(inPlace: true, its microBatch and gradAccumulation), and ends where the restart path ends, bit
for bit: at the first step (the fresh start's state) and mid-run (a checkpoint's)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit


def run(tmp: Path, *, in_place: bool, **faults: object) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    task = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "outOfMemoryAbove": 4, **faults}}
    job = manifest(
        tmp,
        task=task,
        training={"steps": 30, "batchSize": 8, "logEvery": 5},
        precision={"mode": "fp16", "fallback": ["bf16"], "inPlace": in_place},
    )
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp / "out" / "report.json").read_text()), result.stdout


def final_sha(tmp: Path) -> str:
    (state,) = (tmp / "out").rglob("step-000000030/state.pt")
    return hashlib.sha256(state.read_bytes()).hexdigest()


def starts(tmp: Path) -> int:
    lines = (tmp / "out" / "attempts" / "a0" / "worker0.log").read_text().splitlines()
    return sum(1 for line in lines if line.startswith("{") and json.loads(line)["event"] == "start")


def shapes(report: dict) -> list[tuple]:
    return [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"], a["startStep"], a.get("inPlace"))
            for a in report["attempts"]]  # fmt: skip


@pytest.mark.process
@pytest.mark.parametrize("from_step", [None, 15], ids=["first-step", "mid-run"])
def test_out_of_memory_goes_on_in_a_smaller_micro_batch_in_place_as_the_restart_path_does(
    tmp_path: Path, from_step: int | None
) -> None:
    faults = {} if from_step is None else {"outOfMemoryFromStep": from_step}
    inplace, said = run(tmp_path / "inplace", in_place=True, **faults)
    restart, _ = run(tmp_path / "restart", in_place=False, **faults)
    back = 0 if from_step is None else 10  # the fresh start, or the checkpoint at step 10
    for report, how in ((inplace, True), (restart, None)):
        assert report["phase"] == "Succeeded"
        assert shapes(report) == [("fp16", "OutOfDeviceMemory", 8, 1, 0, None), ("fp16", "Succeeded", 4, 2, back, how)]
        assert report["attempts"][0]["endStep"] == (from_step or 0)
        assert "out of GPU memory" in report["attempts"][0]["message"]
        assert report["attempts"][1]["recoverySeconds"] >= 0  # the trainer's figure, or the fault line's clock
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")
    # One trainer process, started once, for the whole in-place run; the restart path started a second.
    assert sorted(p.name for p in (tmp_path / "inplace" / "out" / "attempts").iterdir()) == ["a0"]
    assert starts(tmp_path / "inplace") == 1
    assert sorted(p.name for p in (tmp_path / "restart" / "out" / "attempts").iterdir()) == ["a0", "a1"]
    assert "micro-batch 8 -> 4 x 2" in said and "micro-batch 4 x 2" in said  # live, and in the summary


@pytest.mark.process
def test_a_numeric_fault_after_a_split_made_in_place_falls_back_in_place_too(tmp_path: Path) -> None:
    """Out of memory at step 15 (back to step 10 in 4 x 2), then fp16 overflows at step 22: bf16
    goes on in the same process, in the same split, as a restarted bf16 attempt would."""
    faults = {"outOfMemoryFromStep": 15, "overflowAtStep": 22}
    inplace, _ = run(tmp_path / "inplace", in_place=True, **faults)
    restart, _ = run(tmp_path / "restart", in_place=False, **faults)
    for report in (inplace, restart):
        ends = [(a["precision"], a["reason"], a["microBatch"]) for a in report["attempts"]]
        assert ends == [("fp16", "OutOfDeviceMemory", 8), ("fp16", "NumericFault", 4), ("bf16", "Succeeded", 4)], ends
    assert [a.get("inPlace") for a in inplace["attempts"]] == [None, True, True]
    assert starts(tmp_path / "inplace") == 1
    assert [a["startStep"] for a in inplace["attempts"]] == [a["startStep"] for a in restart["attempts"]]
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")
