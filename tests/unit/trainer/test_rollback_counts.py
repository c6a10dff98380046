"""A rollback forgives the non-finite losses of the steps it undoes, all of them: also those the
guard counted on the device after its last read (a fault seen at a step's end, not at a read:
guard.maxConsecutiveOverflows). Left counted, they came back at the next read as a new
non-finite loss (a rollback for nothing) and, three of them, ended the precision for bad data
that was skipped already."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.api import Guard
from mpjob_trainer import session as mpjob
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from tests.unit.trainer.conftest import spec, train_linear

pytestmark = pytest.mark.unit


def close(g: NumericGuard, step: int, loss: float) -> None:
    """Close 1-based step `step`: an applied update unless its loss is non-finite (GradScaler)."""
    g.begin_step()
    g.observe_loss(torch.tensor(loss))
    if math.isfinite(loss):
        g.optimizer_stepped()
    g.end_step(step, uses_scaler=True)


def test_a_rollback_after_a_fault_between_reads_forgives_the_losses_not_read_yet() -> None:
    g = NumericGuard(Guard(), torch.device("cpu"), World(rank=0, size=1, local_rank=0))
    for step in range(1, 6):
        close(g, step, 1.0)
    g.read(None)
    close(g, 6, 1.0)
    close(g, 7, math.nan)  # the bad step; its fault is seen at its end, before any read
    g.rewind(5)  # the data rung rolls back to the checkpoint at step 5
    for step in range(6, 11):
        close(g, step, 1.0)  # run again, the bad sample left out
    reading = g.read(None)
    assert reading.non_finite_losses - g.forgiven == 0
    assert g.new_non_finite == 0 and g.healthy()


def test_bad_data_skipped_at_overflows_does_not_end_the_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    guard = {"maxConsecutiveOverflows": 1, "maxNonFiniteLosses": 3}
    job = spec(
        training={"steps": 20, "batchSize": 4, "logEvery": 10},
        precision={"mode": "fp16", "lossScale": {"init": 128.0}, "guard": guard},
    )
    bad = {2, 4, 6}  # each a step of its own: every one a fault, a replay and a skip before the read at 10

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if i in bad and i not in run.quarantined:  # sample i, the step's one bad one, left out
            x[0, 0] = math.nan
        return x

    report = train_linear(tmp_path, monkeypatch, job, "fp16", inputs)
    assert report.reason == "Succeeded", report.message
    assert report.skipped is not None and report.skipped.count == 3


def test_with_replays_off_a_lone_non_finite_loss_costs_no_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = spec(
        training={"steps": 10, "batchSize": 4, "logEvery": 5},
        precision={"mode": "fp16", "lossScale": {"init": 128.0}, "guard": {"replaySteps": 0}},
    )
    ran: list[int] = []

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        ran.append(i)
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        x[0, 0] = math.nan if i == 3 else x[0, 0]  # GradScaler skips it: nothing to replay, nothing to roll back
        return x

    report = train_linear(tmp_path, monkeypatch, job, "fp16", inputs)
    assert report.reason == "Succeeded" and report.replay is None, report.message
    assert ran == list(range(10))  # each step once: no suspect rolled back and run again


class TwoRanks:
    """Two ranks' guards in one process, each on a thread of its own, meeting in the guard's
    collectives as a process group's ranks meet: every rank's row, in rank order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.barrier, self.rows = threading.Barrier(2, timeout=30), [torch.zeros(0), torch.zeros(0)]
        monkeypatch.setattr("mpjob_trainer.guard.all_gather_rows", self.gather)
        monkeypatch.setattr("mpjob_trainer.guard.all_reduce_max", lambda t, world: self.gather(t, world).amax(dim=0))

    def gather(self, row: torch.Tensor, world: World) -> torch.Tensor:
        self.rows[world.rank] = row.clone()
        self.barrier.wait()
        rows = torch.stack(self.rows)
        self.barrier.wait()  # both have read before either writes again
        return rows

    def run(self, each: Callable[[NumericGuard], Any]) -> list[Any]:
        """`each` on both ranks' guards at once: what it returned, by rank."""
        guards = [NumericGuard(Guard(max_non_finite_losses=3), torch.device("cpu"), World(r, 2, r)) for r in (0, 1)]
        with ThreadPoolExecutor(2) as pool:
            return [f.result() for f in [pool.submit(each, g) for g in guards]]


def test_a_rollback_forgives_each_rank_its_own_non_finite_losses_not_the_rank_that_saw_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad sample on rank 1 is skipped (rolled back); then rank 0's own losses go non-finite three
    times: rank 0 holds three since the rollback, the guard's limit, whatever rank 1 saw before it."""

    def attempt(g: NumericGuard) -> tuple[bool, bool]:
        rank = g.world.rank
        for step in range(1, 6):
            close(g, step, 1.0)
        g.read(None)
        close(g, 6, math.nan if rank == 1 else 1.0)  # gradients all-reduced: both ranks skip the step
        suspect = g.read(None).non_finite_losses > 0 and g.new_non_finite > 0
        g.rewind(5)  # the data rung: fp32 found step 6's sample bad, skipped it, runs step 6 again
        for step in range(6, 11):
            close(g, step, math.nan if rank == 0 and step in (7, 8, 9) else 1.0)
        return suspect, g.check(10, g.read(None), math.nan, None) is not None

    (suspect, fault), same = TwoRanks(monkeypatch).run(attempt)
    assert suspect and (suspect, fault) == same  # the ranks agree
    assert fault, "rank 0's three non-finite losses since the rollback end the precision"
