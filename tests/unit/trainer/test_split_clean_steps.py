"""A fallback attempt that runs out of device memory before it wrote a checkpoint of its own goes on
in a smaller split in place from the checkpoint the faulted precision wrote before the fault: its
clean steps still count from the step that faulted (as the restart the planner makes of it is told,
repromoteCountsFrom), not from that checkpoint, or it would go back up before it passed the fault."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch, InPlaceSplit
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 24, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp16", "fallback": ["bf16"], "repromoteAfterSteps": 8},
    checkpoint={"everySteps": 4},
)


def attempt(launch: AttemptLaunch, tmp_path: Path, *, stop_at: int | None = None) -> TerminationReport:
    """A linear model's loop in this process: step index 5 runs out of memory in a micro-batch of 4."""
    micro = [launch.micro_batch or 4]
    with pytest.raises(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            if i == 5 and micro[0] == 4 and stop_at is None:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            with run.autocast():
                loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        def reshape(micro_batch: int, accumulation: int) -> None:
            micro[0] = micro_batch

        run.register_step(one_step, samples=lambda i: [i], reshape=reshape)
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.preemption.raised = run.preemption.raised or i + 1 == stop_at
            run.end_step(i + 1, samples=4)
    return TerminationReport.parse_message((tmp_path / "report.json").read_text())


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
