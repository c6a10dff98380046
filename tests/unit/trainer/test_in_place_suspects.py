"""An attempt begun in place (a re-promotion, a smaller split) judges its suspect steps afresh, as a
restarted attempt (a new process) does: a suspect step the attempt before it found to be the
precision's (replayed finite in fp32) does not make the next attempt blame its own non-finite
losses on its precision, so bad data it meets later is still replayed and quarantined
(session.skipping, session.inplace)."""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch, InPlaceSplit, InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit

#: Every step is read (a suspect is replayed at the step it is seen), a checkpoint every 2 steps.
JOB = spec(
    training={"steps": 14, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp16", "fallback": ["bf16"]},
    checkpoint={"everySteps": 2},
)
#: Step index 2 overflows the first time it runs (a transient: the fp32 replay finds it finite,
#: the precision's); step index 10 holds a bad sample, non-finite in every precision.
TRANSIENT, BAD = 2, 10


def train(launch: AttemptLaunch, overflowed: set[int], *, out_of_memory: int | None = None) -> TerminationReport:
    """The mean square of a seeded linear model through `launch` in this process, to its end (an exit
    other than success is its report's); `overflowed`: the transient steps run already (across the
    restart path's attempts); step index `out_of_memory` runs out of device memory the first time."""

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if i == TRANSIENT and i not in overflowed:
            overflowed.add(i)
            x[0, 0] = math.inf
        if i == BAD and i not in run.quarantined:
            x[0, 0] = math.nan
        return x

    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            nonlocal out_of_memory
            if i == out_of_memory:
                out_of_memory = None
                raise torch.OutOfMemoryError("out of memory (a test's)")
            with run.autocast():
                loss = model(inputs(run, i)).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i], reshape=lambda micro, accumulation: None)
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.end_step(i + 1, samples=4)
    return TerminationReport.model_validate_json(Path(os.environ["MPJOB_TERMINATION_LOG"]).read_text())


def test_bad_data_after_a_repromotion_in_place_is_quarantined_as_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bf16 = in_process_launch(tmp_path, monkeypatch, JOB, "bf16").model_copy(
        update={"attempt": 1, "repromote_after_steps": 4}
    )
    # In place: bf16's suspect at step 3 is the precision's; re-promoted to fp16 at step 4's checkpoint.
    promote = InPlaceTarget(precision="fp16")
    in_place = bf16.model_copy(update={"checkpoint_dir": str(tmp_path / "inplace"), "promote_in_place_to": promote})
    report = train(in_place, set())
    assert report.reason == "Succeeded" and report.precision == "fp16", report.message
    assert [(c.kind, c.to_precision) for c in report.precision_changes] == [("repromote", "fp16")]
    assert report.skipped is not None, "the bad step after the re-promotion was not quarantined"
    assert [(s.step, s.cause) for s in report.skipped.steps] == [(BAD, "data")]

    # The restart path: bf16 ends Repromote, fp16 restarts from its checkpoint and quarantines the bad step.
    overflowed: set[int] = set()
    restart = bf16.model_copy(update={"checkpoint_dir": str(tmp_path / "restart")})
    promoted = train(restart, overflowed)
    assert promoted.reason == "Repromote" and promoted.last_good_checkpoint is not None, promoted.message
    fp16 = restart.model_copy(update={"attempt": 2, "precision": "fp16", "repromote_after_steps": None,
                                      "resume_from": promoted.last_good_checkpoint.path})  # fmt: skip
    restarted = train(fp16, overflowed)
    assert restarted.reason == "Succeeded" and restarted.skipped is not None, restarted.message
    assert restarted.skipped.steps == report.skipped.steps
    ours, theirs = (torch.load(tmp_path / d / "step-000000014" / "state.pt")["model"] for d in ("inplace", "restart"))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_bad_data_after_a_split_in_place_is_quarantined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fp16 = in_process_launch(tmp_path, monkeypatch, JOB, "fp16")
    # fp16's suspect at step 3 is the precision's; step 7 runs out of memory and goes on in 2 x 2 in place.
    split = fp16.model_copy(update={"in_place_splits": [InPlaceSplit(micro_batch=2, grad_accumulation=2)]})
    report = train(split, set(), out_of_memory=6)
    assert report.reason == "Succeeded", report.message
    assert [(c.kind, c.micro_batch) for c in report.precision_changes] == [("microBatch", 2)]
    assert report.skipped is not None, "the bad step after the split was not quarantined"
    assert [(s.step, s.cause) for s in report.skipped.steps] == [(BAD, "data")]
