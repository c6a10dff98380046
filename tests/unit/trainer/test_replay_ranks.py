"""The fp32 replay under several processes (DDP under the launcher, through `mpjob run`):
every rank replays the same steps from the same weights and reaches the same verdict, no
rank is stopped while another replays, and a data verdict names the ranks and samples."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob_contract.report import TerminationReport
from mpjob_trainer.data import StepSampler
from tests import warm
from tests.helpers import NO_PLOT

pytestmark = pytest.mark.unit

SAMPLES, BATCH, SEED = 512, 8, 0
#: 0-based index of the faulting step: after the checkpoint at step 10, before the log at 15.
FAULT = 13


def job(world: int, args: dict[str, Any], *, on_bad_data: str = "fail") -> dict[str, Any]:
    """A job whose data verdict ends the attempt (`fail`: the verdict is what these tests read)
    or is skipped by the data rung (`skip`)."""
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": f"ranks{world}"},
        "spec": {
            "task": {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": SAMPLES, **args}},
            "training": {"steps": 20, "batchSize": BATCH, "logEvery": 5, "seed": SEED},
            "precision": {"mode": "fp16", "fallback": [], "guard": {"maxNonFiniteLosses": 1, "onBadData": on_bad_data}},
            "checkpoint": {"everySteps": 10},
            "resources": {"gpusPerWorker": 0, "processesPerWorker": world},
        },
    }


def shares(world: int, step: int) -> list[list[int]]:
    """Each rank's samples of `step`, as the builtin loop's sampler serves them."""
    return [StepSampler(SAMPLES, BATCH, 1, world, rank, SEED).step_indices(step) for rank in range(world)]


def run(tmp: Path, manifest: dict[str, Any]) -> tuple[dict[str, Any], TerminationReport]:
    """`mpjob run` of a job that fails in its first attempt: the status and that attempt's report."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "job.yaml").write_text(yaml.safe_dump(manifest))
    result = warm.run(
        [sys.executable, "-m", "mpjob.cli", "run", str(tmp / "job.yaml"), "--out", str(tmp / "out"), *NO_PLOT],
        capture_output=True,
        text=True,
        timeout=300,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}),
    )
    assert result.returncode != 0, result.stdout[-3000:]
    status = json.loads((tmp / "out" / "report.json").read_text())
    text = (tmp / "out" / "attempts" / "a0" / "termination-worker0.json").read_text()
    return status, TerminationReport.parse_message(text)


def every_rank_exited(status: dict[str, Any], world: int, code: int) -> None:
    """The pod's message lists each rank's ending: all ended by themselves, none was stopped."""
    (attempt,) = status["attempts"]
    assert attempt["exitCode"] == code and attempt["worldSize"] == world
    listed = ", ".join(f"rank {r} exited {code}" for r in range(world))
    assert attempt["message"].endswith(f"[{listed}]"), attempt["message"]
    assert "SIGTERM" not in attempt["message"] and "inconclusive" not in attempt["message"]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.process
def test_bad_data_on_one_rank_names_that_rank_and_its_samples(tmp_path: Path, world: int) -> None:
    rank = world - 1
    share = shares(world, FAULT)[rank]
    status, report = run(tmp_path, job(world, {"nonFiniteSamples": [share[2]]}))
    every_rank_exited(status, world, 45)
    replay = report.replay
    assert replay is not None and replay.verdict == "data" and replay.from_checkpoint
    assert (replay.offending_step, replay.ranks, replay.samples) == (FAULT, [rank], share)
    assert replay.steps == FAULT - 10 + 1  # from the checkpoint at step 10, every rank alike
    assert f"step {FAULT + 1} is non-finite too" in report.message and f"(rank {rank};" in report.message


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.process
def test_bad_data_on_every_rank_names_every_rank(tmp_path: Path, world: int) -> None:
    by_rank = shares(world, FAULT)
    status, report = run(tmp_path, job(world, {"nonFiniteSamples": [share[0] for share in by_rank]}))
    every_rank_exited(status, world, 45)
    replay = report.replay
    assert replay is not None and replay.verdict == "data" and replay.offending_step == FAULT
    assert replay.ranks == list(range(world))
    assert replay.samples == [i for share in by_rank for i in share][:32]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.process
def test_a_precision_overflow_on_every_rank_replays_finite_everywhere(tmp_path: Path, world: int) -> None:
    status, report = run(tmp_path, job(world, {"overflowAtStep": FAULT}))
    every_rank_exited(status, world, 42)
    replay = report.replay
    assert replay is not None and replay.verdict == "precision" and replay.from_checkpoint
    assert (replay.first_step, replay.steps, replay.ranks) == (FAULT, 4, [])
    assert f"fp32 replayed steps {FAULT - 2}-{FAULT + 1} finitely" in report.message


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.process
def test_bad_data_on_one_rank_is_skipped_by_every_rank_and_the_job_succeeds(tmp_path: Path, world: int) -> None:
    """The data rung under several processes: every rank rolls back to the same checkpoint,
    quarantines only the bad sample of the rank the replay named, and trains on to the end."""
    rank = world - 1
    bad = shares(world, FAULT)[rank][2]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(world, {"nonFiniteSamples": [bad]}, on_bad_data="skip")))
    result = warm.run(
        [
            sys.executable,
            "-m",
            "mpjob.cli",
            "run",
            str(tmp_path / "job.yaml"),
            "--out",
            str(tmp_path / "out"),
            *NO_PLOT,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}),
    )
    assert result.returncode == 0, result.stdout[-3000:]
    status = json.loads((tmp_path / "out" / "report.json").read_text())
    (attempt,) = status["attempts"]
    assert (attempt["precision"], attempt["reason"], attempt["worldSize"]) == ("fp16", "Succeeded", world)
    (step,) = status["skipped"]["steps"]
    assert step["cause"] == "data" and step["step"] == FAULT
    assert step["samples"] == [{"first": bad, "last": bad}]


@pytest.mark.process
def test_an_fp32_attempts_bad_data_on_one_rank_names_that_rank_and_its_samples(tmp_path: Path) -> None:
    """An fp32 attempt's own non-finite step is the verdict (no replay): it names the rank whose local loss
    went non-finite and its samples, as a replay does, not every rank (the others' losses go non-finite
    only a step later, on the weights the all-reduced gradient spoilt)."""
    world, rank = 2, 1
    share = shares(world, FAULT)[rank]
    manifest = job(world, {"nonFiniteSamples": [share[2]]})
    manifest["spec"]["precision"]["mode"] = "fp32"
    status, report = run(tmp_path, manifest)
    every_rank_exited(status, world, 45)
    replay = report.replay
    assert replay is not None and replay.verdict == "data" and replay.steps == 0
    assert (replay.offending_step, replay.ranks, replay.samples) == (FAULT, [rank], share)
