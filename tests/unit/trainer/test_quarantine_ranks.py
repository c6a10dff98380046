"""A quarantined sample under several processes: every rank runs the same passes every step.

With one sample per rank and step, a quarantined sample leaves its rank nothing to train on in
each step it comes back in (the catch-up that re-runs its step, and each later epoch), while the
other rank trains on. The builtin loop pads that rank's step with a pass that weighs nothing, so
the gradient all-reduce (DDP), and the all-gathers and reduce-scatters (FSDP2), meet on every
rank and the job trains on, instead of waiting on a peer until the collective timeout.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import TerminationReport
from mpjob_trainer.data import StepSampler
from mpjob_trainer.quarantine import Quarantine
from tests import warm
from tests.helpers import rendezvous
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

#: An odd number of samples: each epoch a sample lands on either rank.
SAMPLES, WORLD, STEPS, SEED = 9, 2, 24, 3
#: The poisoned sample: rank 1's at step 3, its first (the checkpoint at step 2 is rolled back to).
BAD = StepSampler(SAMPLES, 1, 1, WORLD, 1, SEED).step_indices(3)[0]
LAUNCHER = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", str(WORLD), "--workers", "1", "--"]
#: A run takes ~20 s; a rank waiting on a peer's collective would wait 30 min (gloo's timeout).
HANG = 150


def job(strategy: str, mode: str) -> dict[str, Any]:
    return spec(
        task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": SAMPLES, "nonFiniteSamples": [BAD]}},
        training={"steps": STEPS, "batchSize": 1, "logEvery": 5, "seed": SEED},
        precision={"mode": mode, "fallback": [], "guard": {"maxNonFiniteLosses": 1, "onBadData": "skip"}},
        checkpoint={"everySteps": 2},
        parallelism={"strategy": strategy},
    )


def alone(step: int) -> list[list[int]]:
    """Each rank's samples of `step` once BAD is quarantined."""
    quarantine = Quarantine()
    quarantine.add(3, "data", [BAD])
    return [StepSampler(SAMPLES, 1, 1, WORLD, r, SEED, quarantine=quarantine).step_indices(step) for r in range(WORLD)]


def test_the_bad_sample_comes_back_on_one_rank_only() -> None:
    """The premise of the run below: steps after the skip where one rank has no sample left and the other has one."""
    served = [
        [StepSampler(SAMPLES, 1, 1, WORLD, r, SEED).step_indices(step) for r in range(WORLD)] for step in range(3)
    ]
    assert BAD not in [i for ranks in served for share in ranks for i in share]  # first served at step 3
    lopsided = [step for step in range(3, STEPS) if sorted(map(len, alone(step))) == [0, 1]]
    assert lopsided[0] == 3 and len(lopsided) >= 3  # the re-run skipped step, and later epochs


@pytest.mark.process
@pytest.mark.timeout(HANG + 60)
@pytest.mark.parametrize(("strategy", "mode"), [("ddp", "fp16"), ("fsdp", "fp32")])  # fp32: FSDP's fp16 is not replayed
def test_a_sample_quarantined_on_one_rank_trains_on_to_the_end_on_every_rank(
    tmp_path: Path, strategy: str, mode: str
) -> None:
    with rendezvous(WORLD) as meet:
        env = launch_env(tmp_path, job(strategy, mode), mode, extra=meet)
        proc = warm.run(
            [*LAUNCHER, sys.executable, "-m", "mpjob_trainer"], env=env, capture_output=True, text=True, timeout=HANG
        )
    assert proc.returncode == ExitCode.SUCCESS, (proc.stdout + proc.stderr)[-3000:]
    events = parse(proc.stdout)
    (skipped,) = [e for e in events if e["event"] == "dataSkipped"]
    assert skipped["steps"] == [3] and skipped["samples"] == [{"first": BAD, "last": BAD}]
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report.precision == mode and report.skipped is not None and report.skipped.samples == 1
    last = [e for e in events if e["event"] == "step"][-1]
    assert last["step"] == STEPS and last["loss"] is not None
