"""A fallback in place whose target names a split (launch.inPlaceTo microBatch x gradAccumulation)
is refused by the trainer for a sharded model (FSDP2 is wrapped for one shape of its step:
session.inplace._why_not_in), whatever the launch says: the planner leaves such targets out
(mpjob.planning.inplace), a launch from another planner may not. The attempt ends as the contract
says for a precision that cannot go on (exit 42, a NumericFault report saying why it was not made in
place), on every rank, with nothing lost: its last good checkpoint stands as it was written, and the
restart the operator makes from it in the next precision and that split trains to the end.

Two processes of the builtin loop under the launcher, FSDP2 on the CPU over gloo."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from tests import warm
from tests.helpers import free_port
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
    env = launch_env(tmp, JOB, precision, ckpt=tmp / "ckpt", extra={"MASTER_PORT": str(free_port())})
    env["MPJOB_LAUNCH"] = json.dumps({**json.loads(env["MPJOB_LAUNCH"]), **launch})
    proc = warm.run([*LAUNCHER, sys.executable, "-m", "mpjob_trainer"], env=env, capture_output=True, text=True)
    report = Path(env["MPJOB_TERMINATION_LOG"])
    read = TerminationReport.parse_message(report.read_text()) if report.exists() else None
    return proc.returncode, parse(proc.stdout), read


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.process
def test_a_sharded_model_refuses_a_fallback_in_place_that_splits_and_restarts_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    code, lines, report = attempt(tmp_path, "fp16", inPlaceTo=[SPLIT])
    assert code == ExitCode.NUMERIC_FAULT and report is not None, lines[-5:]
    assert (report.reason, report.precision, report.precision_changes) == ("NumericFault", "fp16", [])
    why = "not in place (a sharded model is wrapped for one shape of its step, and the fallback splits the micro-batch)"
    assert why in report.message and "the next attempt restarts" in report.message, report.message
    assert [e for e in lines if e["event"] == "precisionChanged"] == []  # no rank changed anything
    faults = [e["rule"] for e in lines if e["event"] == "fault"]  # every rank's own line
    assert faults == [report.rule, report.rule] and report.rule == "MaxNonFiniteLosses", lines[-5:]

    good = report.last_good_checkpoint
    assert good is not None and good.step == 15, report  # the last before the overflow
    ckpt = tmp_path / "ckpt"
    before = files(Path(good.path))
    saved = sorted(p.parent.name for p in ckpt.glob("step-*/manifest.json"))
    assert saved == [f"step-{step:09d}" for step in (5, 10, 15)]  # nothing of the faulted steps saved

    # The restart the contract says comes next: fp32 in the split, from that very checkpoint.
    code, lines, after = attempt(tmp_path / "restart", "fp32", attempt=1, resumeFrom=good.path, checkpointDir=str(ckpt),
                                 microBatch=2, gradAccumulation=2)  # fmt: skip
    assert code == ExitCode.SUCCESS and after is not None, lines[-5:]
    assert (after.reason, after.start_step, after.step) == ("Succeeded", good.step, 25), after
    assert files(Path(good.path)) == before  # never written over
