"""One attempt of a seeded linear model's own loop through the SDK, in this process: what the
in-place re-promotion tests run, each with the batches (and micro-batch splits) of its case."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob


def seeded_batch(i: int) -> torch.Tensor:
    """Step index `i`'s 4 samples, the same in every attempt."""
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(i))


def linear_attempt(
    launch: AttemptLaunch,
    tmp_path: Path,
    batch: Callable[[mpjob.Session, int], torch.Tensor],
    *,
    stop_at: int | None = None,
    reshape: Callable[[int, int], None] | None = None,
) -> TerminationReport:
    """An nn.Linear(8, 1) trained by SGD on `batch(run, i)` at step index i (registered for replay,
    `reshape` told of a split in place), SIGTERM during step `stop_at`; the attempt's report."""
    with pytest.raises(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(8, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            x = batch(run, i)
            with run.autocast():
                loss = model(x).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i], reshape=reshape)
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.preemption.raised = run.preemption.raised or i + 1 == stop_at
            run.end_step(i + 1, samples=4)
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report is not None, "the attempt wrote no report"
    return report
