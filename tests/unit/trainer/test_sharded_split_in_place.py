"""A fallback in place whose target names a split (launch.inPlaceTo microBatch x gradAccumulation)
goes on in place for a sharded model too (session.inplace): the loop is left, and re-enters with
its model wrapped anew in the next precision and its data in the split (the session's spec says
it), the last good checkpoint loaded into it. Every rank changes at the same step, and the steps
after it are the restart path's: the restart the operator would make from that checkpoint in the
same precision and split trains the same losses, to the same final shards, bit for bit.

Two processes of the builtin loop under the launcher, FSDP2 on the CPU over gloo."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer.session.memory import SmallerMicroBatch
from tests import warm
from tests.helpers import rendezvous
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

#: fp16 overflows from step 15 on (for good: fp32 never does); checkpoints every 5 steps.
JOB = spec(
    task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 15}},
    training={"steps": 25, "batchSize": 4, "logEvery": 5},
    precision={"mode": "fp16", "fallback": ["fp32"]},
    checkpoint={"everySteps": 5},
    parallelism={"strategy": "fsdp"},
)
#: fp32 in 2 x 2: the same samples per step as the attempt's 4 x 1.
SPLIT = {"precision": "fp32", "microBatch": 2, "gradAccumulation": 2}
LAUNCHER = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", "2", "--workers", "1", "--"]


def attempt(tmp: Path, precision: str, **launch: Any) -> tuple[int, list[dict[str, Any]], TerminationReport | None]:
    """One attempt of JOB on 2 processes, its launch with `launch`'s fields too: the launcher's exit
    code, the ranks' event lines, the folded termination report."""
    tmp.mkdir(parents=True, exist_ok=True)
    with rendezvous(2) as meet:
        env = launch_env(tmp, JOB, precision, ckpt=tmp / "ckpt", extra=meet)
        env["MPJOB_LAUNCH"] = json.dumps({**json.loads(env["MPJOB_LAUNCH"]), **launch})
        proc = warm.run([*LAUNCHER, sys.executable, "-m", "mpjob_trainer"], env=env, capture_output=True, text=True)
    report = Path(env["MPJOB_TERMINATION_LOG"])
    read = TerminationReport.parse_message(report.read_text()) if report.exists() else None
    return proc.returncode, parse(proc.stdout), read


def losses(lines: list[dict[str, Any]], after: int) -> dict[int, float]:
    """The loss rank 0 logged at each step past `after` (the ranks' agreed loss)."""
    return {e["step"]: e["loss"] for e in lines if e["event"] == "step" and e["step"] > after}


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def shards(folder: Path) -> dict[str, str]:
    """The checkpoint's files by their manifest's sha256: each rank's shards and state; DCP's
    `.metadata` names the folder it was written in, and the manifest when."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return {name: meta["sha256"] for name, meta in manifest["files"].items() if name != ".metadata"}


@pytest.mark.process
def test_a_sharded_model_falls_back_in_place_into_a_split_as_a_restart_from_its_checkpoint_trains(
    tmp_path: Path,
) -> None:
    code, lines, report = attempt(tmp_path, "fp16", inPlaceTo=[SPLIT])
    assert code == ExitCode.SUCCESS and report is not None, lines[-5:]
    assert (report.reason, report.precision, report.step) == ("Succeeded", "fp32", 25), report
    (change,) = report.precision_changes
    said = (change.kind, change.start_step, change.to_precision, change.micro_batch, change.grad_accumulation)
    assert said == ("fallback", 15, "fp32", 2, 2), change  # back to the last good checkpoint, in the split
    changed = [
        (e["startStep"], e["microBatch"], e["gradAccumulation"]) for e in lines if e["event"] == "precisionChanged"
    ]
    assert changed == [(15, 2, 2)], lines[-5:]  # rank 0 tells it; both ranks made it (their shards, below)
    assert [e["event"] for e in lines].count("wrap") == 2  # wrapped twice, in one process
    good = tmp_path / "ckpt" / f"step-{15:09d}"
    before = files(good)

    # The restart the operator would make instead: fp32 in the split, from that checkpoint (a copy
    # in a volume of its own, so that each writes its steps 20 and 25).
    ckpt = tmp_path / "restart" / "ckpt"
    shutil.copytree(good, ckpt / good.name)
    code, again, after = attempt(tmp_path / "restart", "fp32", attempt=1, resumeFrom=str(ckpt / good.name),
                                 checkpointDir=str(ckpt), microBatch=2, gradAccumulation=2)  # fmt: skip
    assert code == ExitCode.SUCCESS and after is not None, again[-5:]
    assert (after.reason, after.start_step, after.step) == ("Succeeded", 15, 25), after
    assert losses(lines, after=15) == losses(again, after=15) and len(losses(again, after=15)) == 2
    last = f"step-{25:09d}"
    assert sorted(shards(ckpt / last)) == ["__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt"]
    assert shards(tmp_path / "ckpt" / last) == shards(ckpt / last)
    assert files(good) == before  # never written over


def test_a_loop_that_re_enters_after_a_split_is_handed_the_split_it_trains_in() -> None:
    """The re-entered loop registers its step again: whatever it built its data from, its reshape
    is told the split made in place (and the session's spec says it); a loop armed before any
    split is told nothing."""
    launch = AttemptLaunch.model_validate({"jobName": "t", "precision": "fp16", "spec": JOB})
    in_place = SimpleNamespace(why_not=None, why_not_split=None)
    context = SimpleNamespace(world=SimpleNamespace(distributed=True))
    memory = SmallerMicroBatch(None, in_place, context, launch)  # type: ignore[arg-type]
    first: list[tuple[int, int]] = []
    memory.arm(lambda micro, accumulation: first.append((micro, accumulation)))
    assert first == []  # it built its data from the launch's split
    memory.resplit(2, 2)  # the fallback's, before the loop is left to wrap its model anew
    again: list[tuple[int, int]] = []
    memory.arm(lambda micro, accumulation: again.append((micro, accumulation)))
    assert again == [(2, 2)] and first == [(2, 2)]
    assert (memory.spec.training.batch_size, memory.spec.training.grad_accumulation) == (2, 2)
