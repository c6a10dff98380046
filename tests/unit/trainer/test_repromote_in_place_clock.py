"""A re-promotion made in place begins an attempt from nothing loaded (the state in memory is the
checkpoint just written), so its own clean steps count from the step it went up at: a checkpoint's
record an earlier rollback loaded (written in the precision it goes up to, before the fallback)
says nothing of the steps since, and must not be taken for the re-promoted attempt's last trouble."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.linear_attempt import linear_attempt, seeded_batch

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 40, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 8, "maxRepromotions": 2},
    checkpoint={"everySteps": 4},
)


def attempt(
    launch: AttemptLaunch, tmp_path: Path, *, stop_at: int | None = None, bad: int | None = None
) -> TerminationReport:
    """One attempt (`linear_attempt`): SIGTERM during step `stop_at`, a non-finite sample at step
    index `bad` (until it is quarantined)."""

    def batch(run: mpjob.Session, i: int) -> torch.Tensor:
        x = seeded_batch(i)
        if i == bad and i not in run.quarantined:
            x[0, 0] = math.nan
        return x

    return linear_attempt(launch, tmp_path, batch, stop_at=stop_at)


def test_a_repromotion_in_place_counts_its_clean_steps_from_where_it_went_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf16 = in_process_launch(tmp_path, monkeypatch, JOB, "bf16")
    first = attempt(bf16, tmp_path, stop_at=4)  # bf16's checkpoint at step 4, its last trouble at 0
    assert first.reason == "Preempted" and first.step == 4, first.message
    # fp32 from it (a fallback restarted), going back up to bf16 in place after 8 clean steps; the
    # bf16 attempt so begun goes up to fp16 after 8 clean steps of its own (a restart: no promoteTo)
    up = InPlaceTarget(precision="bf16", repromote_after_steps=8)
    fp32 = bf16.model_copy(
        update={"attempt": 1, "precision": "fp32", "repromote_after_steps": 8, "promote_in_place_to": up}
    )
    second = attempt(fp32, tmp_path, bad=5)  # bad data at step 6: rolled back to bf16's checkpoint at 4
    assert second.skipped is not None, second.message
    (change,) = second.precision_changes
    assert (change.kind, change.to_precision) == ("repromote", "bf16")
    assert second.reason == "Repromote" and second.precision == "bf16", second.message
    assert second.step - change.step >= 8, (change.step, second.step, second.message)
