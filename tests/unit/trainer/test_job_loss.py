"""The loss a log step reports is the job's: the mean over every rank's samples, not rank 0's
share (mpjob_trainer.job_loss), so the curve goes on unchanged across a resize. It rides in the
guard's one gather at the interval: no host read is added to a step."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.sdk_overhead import host_reads, on_sdk, plain
from mpjob_trainer.job_loss import job_loss, loss_share
from tests.helpers import launched
from tests.unit.trainer.conftest import launch_env, parse, spec

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def joined(*shares: tuple[Any, float]) -> float | None:
    """The job's loss from the ranks' (reported loss, samples), as the guard's gather sums them."""
    return job_loss(torch.stack([loss_share(loss, weight, CPU) for loss, weight in shares]).sum(dim=0).tolist())


def test_the_ranks_losses_weigh_by_their_samples() -> None:
    assert joined((torch.tensor(1.0), 3), (4.0, 1)) == 1.75
    assert joined((torch.tensor(0.25), 1)) == 0.25  # one rank: its own loss, exactly
    assert joined((2.0, 4), (None, 1)) == 2.0  # a rank that trained no sample counts for nothing
    assert joined((None, 1), (None, 1)) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_on_any_rank_is_the_jobs(bad: float) -> None:
    loss = joined((1.0, 8), (torch.tensor(bad), 8))
    assert loss is not None and not math.isfinite(loss)


def test_an_ordinary_step_reads_nothing_more_than_a_plain_loop_and_a_log_step_one_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK's steps between intervals read no device value beyond the plain loop's own (the
    optimizer's); a log step adds one read for the guard's figures and the job's loss together
    (the gradient norm is the other, as the plain loop's loss is its)."""
    monkeypatch.setenv("MPJOB_METRICS_PORT", "off")
    with tempfile.TemporaryDirectory() as folder:
        sdk = host_reads(lambda tick: on_sdk("bf16", 30, tick, Path(folder)))
    bare = host_reads(lambda tick: plain("bf16", 30, tick))
    assert sdk[0] == bare[0]
    assert sdk[1] == bare[1] + 1


# ---------------------------------------------------------------- the builtin loop on 1 and 2 processes
REPO = Path(__file__).resolve().parents[3]


def step_losses(tmp: Path, *, nproc: int, accumulation: int) -> dict[int, float]:
    """The builtin loop's step lines on `nproc` processes of the launcher (gloo on the CPU): 8
    samples per step, `accumulation` micro-batches of 8 / (nproc x accumulation) each."""
    batch = 8 // (nproc * accumulation)
    training = {"steps": 12, "batchSize": batch, "gradAccumulation": accumulation, "logEvery": 4, "seed": 3}
    job = spec(training=training, checkpoint={"everySteps": 100})
    folder = tmp / f"n{nproc}"
    paths = [str(REPO), *(f"{REPO}/{package}" for package in ("trainer-image", "contract", "operator"))]
    env = launch_env(folder, job, "fp32", ckpt=folder / "ckpt", extra={"PYTHONPATH": os.pathsep.join(paths)})
    return {e["step"]: e["loss"] for e in parse(launched(env, nproc)) if e["event"] == "step"}


@pytest.mark.process
def test_one_and_two_processes_report_the_same_loss_for_the_same_weights_and_samples(tmp_path: Path) -> None:
    """Step s trains the same 8 samples from the same weights on one process (2 micro-batches of
    4) and on two (one of 4 each, DDP): the loss shown is the same, not rank 0's half."""
    one = step_losses(tmp_path, nproc=1, accumulation=2)
    two = step_losses(tmp_path, nproc=2, accumulation=1)
    assert sorted(one) == sorted(two) == [4, 8, 12]
    for step, loss in one.items():
        assert two[step] == pytest.approx(loss, rel=1e-5, abs=1e-7), step
