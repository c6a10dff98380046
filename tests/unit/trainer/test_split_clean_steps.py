"""A fallback attempt that runs out of device memory before it wrote a checkpoint of its own goes on
in a smaller split in place from the checkpoint the faulted precision wrote before the fault: its
clean steps still count from the step that faulted (as the restart the planner makes of it is told,
repromoteCountsFrom), not from that checkpoint, or it would go back up before it passed the fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpjob_contract.launch import AttemptLaunch, InPlaceSplit
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.linear_attempt import linear_attempt, seeded_batch

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 24, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 8},
    checkpoint={"everySteps": 4},
)


def attempt(launch: AttemptLaunch, tmp_path: Path, *, stop_at: int | None = None) -> TerminationReport:
    """One attempt (`linear_attempt`): step index 5 runs out of memory in a micro-batch of 4."""
    micro = [launch.micro_batch or 4]

    def batch(run: mpjob.Session, i: int) -> torch.Tensor:
        if i == 5 and micro[0] == 4 and stop_at is None:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return seeded_batch(i)

    def reshape(micro_batch: int, accumulation: int) -> None:
        micro[0] = micro_batch

    return linear_attempt(launch, tmp_path, batch, stop_at=stop_at, reshape=reshape)


def test_a_fallback_split_in_place_before_its_first_checkpoint_counts_from_the_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp16 = in_process_launch(tmp_path, monkeypatch, JOB, "fp16")
    first = attempt(fp16, tmp_path, stop_at=4)  # fp16's checkpoint at step 4; it faults at step 7 (said below)
    assert first.reason == "Preempted" and first.step == 4, first.message
    split = InPlaceSplit(micro_batch=2, grad_accumulation=2, repromote_after_steps=8)
    bf16 = fp16.model_copy(update={"attempt": 1, "precision": "bf16", "repromote_after_steps": 8,
                                   "repromote_counts_from": 7, "in_place_splits": [split]})  # fmt: skip
    second = attempt(bf16, tmp_path)
    (change,) = second.precision_changes
    assert (change.kind, change.start_step) == ("microBatch", 4), change
    assert second.reason == "Repromote" and second.step == 16, (second.step, second.message)  # 7 + 8 clean steps
