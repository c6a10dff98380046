"""fp16 with gradient accumulation: GradScaler scales every micro-batch's loss, and unscales,
steps and updates once per optimizer step; an inf in any one micro-batch skips the whole step
(no micro-batch's gradient is applied) and backs the scale off once."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

JOB = spec(training={"steps": 6, "batchSize": 4, "logEvery": 1}, checkpoint={"everySteps": 6})


def test_an_inf_in_one_micro_batch_skips_the_whole_step_and_backs_the_scale_off_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[int, float | None, int, torch.Tensor]] = []  # step, scale, applied, weights after
    launch = in_process_launch(tmp_path, monkeypatch, JOB, "fp16")
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)
        scaler = run.scaler
        assert scaler is not None
        for i in range(start, run.total_steps):
            for micro in range(2):
                x = torch.randn(4, 4, generator=torch.Generator().manual_seed(10 * i + micro))
                with run.autocast():
                    loss = model(x).pow(2).mean() / 2
                run.backward(loss * math.inf if (i, micro) == (3, 1) else loss, samples=4)
            run.step(optimizer, clip_norm=1.0)
            run.end_step(i + 1, samples=8)
            seen.append((i, scaler.get_scale(), run.applied_steps, model.weight.detach().clone()))
    scales = [s for _, s, _, _ in seen]
    applied = [a for _, _, a, _ in seen]
    # the scale moves only at step 3 (growthInterval 2000 is far), once, by backoffFactor 0.5
    assert scales[3] == scales[2] * 0.5 and scales[4] == scales[3] and scales[2] == scales[1]
    assert applied[3] == applied[2] and applied[4] == applied[3] + 1  # step 3 applied nothing
    assert torch.equal(seen[3][3], seen[2][3])  # micro-batch 0's finite gradient was not applied either
    assert not torch.equal(seen[4][3], seen[3][3])
