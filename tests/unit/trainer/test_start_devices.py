"""The start line names the devices of every process of the attempt, not rank 0's alone: `mpjob
run` charges the GPUs its trainers hold from it, and with processesPerWorker > 1 on a machine
of several GPUs the other local ranks train on other GPUs than rank 0's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from mpjob_trainer.distributed import device_names
from tests import warm
from tests.helpers import rendezvous
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("indices", "kind", "named"),
    [
        ([0, 1], "cuda", ["cuda:0", "cuda:1"]),  # two local ranks on two GPUs: both
        ([1, 0, 1, 0], "cuda", ["cuda:0", "cuda:1"]),  # two workers sharing them: each GPU once
        ([0], "cuda", ["cuda:0"]),
        ([-1, -1], "cpu", ["cpu"]),
    ],
)
def test_every_ranks_device_is_named_once(indices: list[int], kind: str, named: list[str]) -> None:
    assert device_names(indices, kind) == named


@pytest.mark.process
def test_two_processes_start_line_names_the_devices_both_gathered(tmp_path: Path) -> None:
    """Two gloo processes of one worker: the one start line (rank 0's) names every rank's device,
    gathered at the start without a hang (on the CPU both train on "cpu")."""
    job = spec(training={"steps": 2, "batchSize": 2, "logEvery": 1}, checkpoint={"everySteps": 100})
    paths = [str(REPO), *(f"{REPO}/{package}" for package in ("trainer-image", "contract", "operator"))]
    with rendezvous(2) as meet:
        extra = {"PYTHONPATH": os.pathsep.join(paths), **meet}
        env = launch_env(tmp_path, job, "fp32", extra=extra)
        launcher = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", "2", "--workers", "1"]
        proc = warm.run(
            [*launcher, "--", sys.executable, "-m", "mpjob_trainer"],
            env=env,
            capture_output=True,
            text=True,
            timeout=400,
        )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (start,) = [e for e in parse(proc.stdout) if e["event"] == "start"]
    assert start["worldSize"] == 2
    assert start["devices"] == [start["device"]] == ["cpu"]
