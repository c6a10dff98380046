"""`mpjob run` of an fsdp (FSDP2) job on 2 processes changing precision in place: FSDP2 fixes its
MixedPrecisionPolicy when it wraps, so the builtin loop is left and runs again in the same
processes, its model wrapped anew in the next precision and its state loaded as a restarted
attempt's would be (session.inplace). A fallback and a re-promotion in place end with the same
shards, bit for bit, as the restart path, in one pair of trainer processes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.localrun import test_fsdp_run as fsdp_run

pytestmark = pytest.mark.unit

OVERFLOW = {"overflowAtStep": 15, "overflowUntilStep": 20}
MLP = {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, **OVERFLOW}}


def run_job(
    tmp: Path, *, in_place: bool, task: dict[str, Any] = MLP, precision: dict[str, Any] | None = None, **spec: Any
) -> tuple[dict[str, Any], Path]:
    """fp16 on 2 processes, the default policy (gathered in the attempt's precision), a transient
    overflow; `precision` and `spec` change the job's precision fields and other spec fields."""
    two = {
        "training": {"steps": 30, "batchSize": 8, "logEvery": 5},
        "checkpoint": {"everySteps": 5},
        "resources": {"gpusPerWorker": 0, "processesPerWorker": 2},
    }
    ladder = {"mode": "fp16", "fallback": ["bf16", "fp32"], **(precision or {}), "inPlace": in_place}
    name = "inplace" if in_place else "restart"
    _, report, out = fsdp_run.run_job(tmp, name, task=task, precision=ladder, **{**two, **spec})
    return report, out


def both_ways(tmp: Path, **job: Any) -> dict[str, tuple[dict[str, Any], Path]]:
    """The job with `inPlace: true` and with `inPlace: false`."""
    return {k: run_job(tmp, in_place=k == "inplace", **job) for k in ("inplace", "restart")}


def fell_back_in_place_as_restarted(runs: dict[str, tuple[dict[str, Any], Path]], ends: list[Any]) -> None:
    """Both ways the attempts end as `ends` (precision, reason, start step); in place the second
    attempt was made in one pair of processes, its model wrapped twice, and the final shards are
    the restart path's."""
    for report, _ in runs.values():
        assert [(a["precision"], a["reason"], a["startStep"]) for a in report["attempts"]] == ends
        assert report["phase"] == "Succeeded"
    (inplace, out), (restart, restarted) = runs["inplace"], runs["restart"]
    assert [a.get("inPlace") for a in inplace["attempts"]] == [None, True]
    assert [a.get("inPlace") for a in restart["attempts"]] == [None, None]
    assert final_shards(out) == final_shards(restarted)
    one_pair_of_processes(out, wraps=2)


def one_pair_of_processes(out: Path, wraps: int) -> None:
    """The run's one attempt folder; each rank started once and wrapped its model `wraps` times."""
    attempts = out / "attempts"
    assert sorted(p.name for p in attempts.iterdir()) == ["a0"]
    for log in sorted(attempts.glob("a0/worker*.log")):
        events = [json.loads(line)["event"] for line in log.read_text().splitlines() if line.startswith("{")]
        assert events.count("start") == 1 and events.count("wrap") == wraps, log


def final_shards(out: Path) -> dict[str, str]:
    """The final checkpoint's files by sha256: each rank's shards and state; DCP's `.metadata` names
    the folder it was written in, which differs between the two runs."""
    last = max(out.rglob("step-*/manifest.json"), key=lambda path: path.parent.name)
    manifest = json.loads(last.read_text())
    return {name: meta["sha256"] for name, meta in manifest["files"].items() if name != ".metadata"}


@pytest.mark.process
def test_a_sharded_model_falls_back_and_is_repromoted_in_place_as_the_restart_path_ends(tmp_path: Path) -> None:
    runs = both_ways(tmp_path, precision={"repromoteAfterSteps": 5})  # clean from the fault at 20: up at 25
    for report, _ in runs.values():
        ends = [(a["precision"], a["reason"], a["startStep"], a["worldSize"]) for a in report["attempts"]]
        assert ends == [("fp16", "NumericFault", 0, 2), ("bf16", "Repromote", 15, 2), ("fp16", "Succeeded", 25, 2)]
        assert report["phase"] == "Succeeded"
    (inplace, out), (restart, restarted) = runs["inplace"], runs["restart"]
    assert [a.get("inPlace") for a in inplace["attempts"]] == [None, True, True]
    assert [a.get("inPlace") for a in restart["attempts"]] == [None, None, None]
    assert all(a["recoverySeconds"] >= 0 for a in inplace["attempts"][1:])
    shards = final_shards(out)
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]
    assert shards == final_shards(restarted)
    one_pair_of_processes(out, wraps=3)
    assert sorted(p.name for p in (restarted / "attempts").iterdir()) == ["a0", "a1", "a2"]


@pytest.mark.process
def test_a_sharded_model_faulting_before_its_first_checkpoint_starts_over_in_place(tmp_path: Path) -> None:
    """No checkpoint yet and nothing else keeps the fresh start (no replay under this policy, bad
    data not skipped): the in-place fallback keeps it, and bf16 starts from step 0 as a restart would."""
    early = {**MLP, "args": {**MLP["args"], "overflowAtStep": 2, "overflowUntilStep": 40}}
    runs = both_ways(tmp_path, task=early, precision={"guard": {"onBadData": "fail"}})
    fell_back_in_place_as_restarted(runs, [("fp16", "NumericFault", 0), ("bf16", "Succeeded", 0)])


@pytest.mark.process
def test_an_sdk_loop_run_through_reentering_is_wrapped_anew_in_place(tmp_path: Path) -> None:
    """The public path: a script's loop on the SDK (run.reentering, run.register_step) is left
    with Rewrap and runs again with its sharded model wrapped in bf16; the shards at the end are
    those of the same script restarted."""
    script = {"command": [sys.executable, str(Path(__file__).with_name("reentering_script.py")), "12"]}
    runs = both_ways(tmp_path, task=script)
    fell_back_in_place_as_restarted(runs, [("fp16", "NumericFault", 0), ("bf16", "Succeeded", 10)])


@pytest.mark.process
def test_an_fp8_drift_on_a_sharded_model_goes_on_in_bf16_in_place(tmp_path: Path) -> None:
    """fp8 (torchao, emulated) on a sharded model gathered in fp32, so the quality gate has its
    fp32 reference: a drift in fp8 only ends fp8, and the model is built anew without fp8 linears
    and sharded for bf16 in the same processes, ending with the restart path's shards."""
    drift = {"builtin": "mlp", "args": {"inputs": 16, "hidden": 32, "samples": 256, "fp8OutlierAtStep": 15}}
    runs = both_ways(
        tmp_path,
        task=drift,
        precision={"mode": "fp8", "fp8": {"emulate": True}},
        training={"steps": 40, "batchSize": 16, "logEvery": 5},
        validation={"everySteps": 10, "maxLossDelta": 0.05},
        parallelism={"strategy": "fsdp", "fsdp": {"mixedPrecisionParam": "fp32"}},
    )
    for report, _ in runs.values():
        assert "QualityDrift: eval loss" in report["attempts"][0]["message"]
    fell_back_in_place_as_restarted(runs, [("fp8", "NumericFault", 0), ("bf16", "Succeeded", 25)])


@pytest.mark.process
def test_a_checkpoint_damaged_before_the_model_is_wrapped_anew_is_passed_over_for_the_one_before_it(
    tmp_path: Path,
) -> None:
    """The checkpoint of step 10, which the fallback at step 12 goes back to, has a shard damaged
    after its save: the re-entered loop's resume passes over it for the one of step 5 (as the
    restarted attempt's resume does), never ending the attempt on the damage."""
    script = {"command": [sys.executable, str(Path(__file__).with_name("reentering_script.py")), "12", "10"]}
    runs = both_ways(tmp_path, task=script)
    fell_back_in_place_as_restarted(runs, [("fp16", "NumericFault", 0), ("bf16", "Succeeded", 5)])
    _, out = runs["inplace"]
    log = "\n".join(p.read_text() for p in sorted((out / "attempts" / "a0").glob("worker*.log")))
    rejected = [json.loads(line) for line in log.splitlines() if '"checkpointRejected"' in line]
    assert rejected and all("step-000000010" in e["path"] for e in rejected), rejected


@pytest.mark.process
def test_a_sharded_model_falls_back_into_a_split_and_takes_it_back_in_place_as_the_restart_path_ends(
    tmp_path: Path,
) -> None:
    """fp16 at 8 x 1 faults, fp32 goes on in 4 x 2 (fallbackKeepsBatch) and fp16 takes 8 x 1 back at
    the re-promotion's checkpoint, written in the split: the loop re-enters in each split, its model
    wrapped anew, and the final shards are the restart path's (in 8 x 1 throughout, they are not)."""
    runs = both_ways(tmp_path, precision={"fallback": ["fp32"], "repromoteAfterSteps": 5})  # up at 25
    for report, _ in runs.values():
        ends = [(a["precision"], a["reason"], a["startStep"], a["microBatch"], a["gradAccumulation"])
                for a in report["attempts"]]  # fmt: skip
        assert ends == [
            ("fp16", "NumericFault", 0, 8, 1),
            ("fp32", "Repromote", 15, 4, 2),
            ("fp16", "Succeeded", 25, 8, 1),
        ]
        assert report["phase"] == "Succeeded"
    (inplace, out), (restart, restarted) = runs["inplace"], runs["restart"]
    assert [a.get("inPlace") for a in inplace["attempts"]] == [None, True, True]
    assert [a.get("inPlace") for a in restart["attempts"]] == [None, None, None]
    said = json.loads((out / "attempts" / "a0" / "termination-worker0.json").read_text())  # the launcher's fold
    changed = [(c["kind"], c["startStep"], c["microBatch"], c["gradAccumulation"]) for c in said["precisionChanges"]]
    assert changed == [("fallback", 15, 4, 2), ("repromote", 25, 8, 1)], changed
    assert final_shards(out) == final_shards(restarted)
    one_pair_of_processes(out, wraps=3)
