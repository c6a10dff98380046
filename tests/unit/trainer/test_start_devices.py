"""The start line names the devices of every process of the attempt, not rank 0's alone: `mpjob
run` charges the GPUs its trainers hold from it, and with processesPerWorker > 1 on a machine
of several GPUs the other local ranks train on other GPUs than rank 0's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mpjob_trainer.distributed import device_names
from tests.helpers import launched
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
    env = launch_env(tmp_path, job, "fp32", extra={"PYTHONPATH": os.pathsep.join(paths)})
    (start,) = [e for e in parse(launched(env, 2)) if e["event"] == "start"]
    assert start["worldSize"] == 2
    assert start["devices"] == [start["device"]] == ["cpu"]
