"""`mpjob run` with precision.inPlace and fallbackKeepsBatch: fp16 (16 x 1) faults, fp32 goes on in
the split 8 x 2 in the same trainer process (rewound to the last good checkpoint), and its
re-promotion takes the full micro-batch back there too (fp16, 16 x 1): both attempts after the
first inPlace: true, ending where the restart path ends, bit for bit: the same samples each step,
the same steps in each precision and split."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.unit.localrun.test_run import manifest, mpjob_run

pytestmark = pytest.mark.unit


def run(tmp: Path, *, in_place: bool, workers: int) -> tuple[dict, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    job = manifest(
        tmp,
        task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, "overflowAtStep": 15,
                                         "overflowUntilStep": 20}},
        training={"steps": 40, "batchSize": 16, "logEvery": 5},
        checkpoint={"everySteps": 5},
        precision={"mode": "fp16", "fallback": ["fp32"], "repromoteAfterSteps": 10, "inPlace": in_place},
        workers=workers,
    )  # fmt: skip
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain")
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads((tmp / "out" / "report.json").read_text()), result.stdout


def final_sha(tmp: Path) -> str:
    (state,) = (tmp / "out").rglob("step-000000040/state.pt")
    return hashlib.sha256(state.read_bytes()).hexdigest()


def shapes(report: dict) -> list[tuple]:
    return [(a["precision"], a["reason"], a["microBatch"], a["gradAccumulation"]) for a in report["attempts"]]


def starts(log: Path) -> int:
    lines = log.read_text().splitlines()
    return sum(1 for line in lines if line.startswith("{") and json.loads(line)["event"] == "start")


@pytest.mark.process
@pytest.mark.parametrize("workers", [1, 2], ids=["one-rank", "ddp-two-ranks"])
def test_a_fallback_splits_and_its_repromotion_takes_the_micro_batch_back_in_the_same_process(
    tmp_path: Path, workers: int
) -> None:
    """With two ranks (DDP) both fall back and split at the same step, and go up and take the split
    back at the same checkpoint: a rank a step apart would hang in, or sum a different step's
    gradients in, the all-reduce."""
    inplace, said = run(tmp_path / "inplace", in_place=True, workers=workers)
    restart, _ = run(tmp_path / "restart", in_place=False, workers=workers)
    for report in (inplace, restart):
        assert report["phase"] == "Succeeded"
        assert shapes(report) == [
            ("fp16", "NumericFault", 16, 1),
            ("fp32", "Repromote", 8, 2),
            ("fp16", "Succeeded", 16, 1),
        ]
        assert report["attempts"][2]["repromoted"] is True
    # The fallback splits the batch in a0's processes; the re-promotion takes it back there too.
    assert [a.get("inPlace") for a in inplace["attempts"]] == [None, True, True]
    assert sorted(p.name for p in (tmp_path / "inplace" / "out" / "attempts").iterdir()) == ["a0"]
    assert starts(tmp_path / "inplace" / "out" / "attempts" / "a0" / "worker0.log") == 1
    for rank in range(workers):  # every rank fell back and split, then went up, at the same steps
        report = json.loads(
            (tmp_path / "inplace" / "out" / "attempts" / "a0" / f"termination-worker{rank}.json").read_text()
        )
        changed = [(c["kind"], c["startStep"], c["toPrecision"], c["microBatch"], c["gradAccumulation"])
                   for c in report["precisionChanges"]]  # fmt: skip
        # fp32's 10 clean steps count from the fault at step 20, not the checkpoint at 15 it resumed from.
        assert changed == [("fallback", 15, "fp32", 8, 2), ("repromote", 30, "fp16", 16, 1)], (rank, changed)
    assert sorted(p.name for p in (tmp_path / "restart" / "out" / "attempts").iterdir()) == ["a0", "a1", "a2"]
    assert [a["startStep"] for a in inplace["attempts"]] == [a["startStep"] for a in restart["attempts"]]
    assert final_sha(tmp_path / "inplace") == final_sha(tmp_path / "restart")
    assert "micro-batch 16 x 1 -> 8 x 2 in place" in said and "micro-batch 8 x 2 -> 16 x 1 in place" in said
