"""A loop that stops early (Session.stop_early, session.early_stop): the step it stops after is
the run's last, checkpointed with the stop recorded, so a retry resumed from it finds the run
finished and trains nothing; the report says the stop."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.early_stop import EarlyStop
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit


@pytest.fixture
def launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AttemptLaunch:
    job = spec(training={"steps": 10, "logEvery": 4}, checkpoint={"everySteps": 4})
    return in_process_launch(tmp_path, monkeypatch, job)


def _steps(launch: AttemptLaunch) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in Path(launch.checkpoint_dir).glob("step-*"))


def _report(launch: AttemptLaunch) -> TerminationReport:
    return TerminationReport.model_validate_json((Path(launch.checkpoint_dir).parent / "report.json").read_text())


def _attempt(launch: AttemptLaunch, stop_after: int | None, *, tell: bool = True) -> tuple[int, bool]:
    """An attempt of a loop that stops after `stop_after` (`tell`: early, as Session.stop_early
    says; else the loop just leaves, as a crash would): where it started, and whether the session
    found the run finished at its start."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mpjob.start(launch=launch) as run:
        start = run.resume(model=model, optimizer=optimizer)
        finished = run.finished
        for step in range(start + 1, run.total_steps + 1):
            if finished:
                break
            run.backward(model(torch.randn(8, 4)).pow(2).mean())
            run.step(optimizer)
            if step == stop_after and tell:
                run.stop_early(step)
            run.end_step(step, samples=8)
            if step == stop_after:
                break
    return start, finished


def test_the_step_a_loop_stops_early_after_is_checkpointed_and_a_retry_trains_nothing(launch: AttemptLaunch) -> None:
    """Step 6 is no checkpoint interval (every 4): before, the stop was known nowhere, the last
    checkpoint was step 4's, and a retry from it trained on to step 10."""
    assert _attempt(launch, 6) == (0, False)
    assert _steps(launch) == [4, 6]
    ended = _report(launch)
    assert (ended.step, ended.last_good_checkpoint and ended.last_good_checkpoint.step) == (6, 6)
    assert ended.message == "trained 6 steps in fp32, stopped early there (the training's own stop)"
    assert _attempt(launch, None) == (6, True)  # the retry: nothing left to train
    retried = _report(launch)
    assert (retried.reason, retried.step, retried.start_step) == ("Succeeded", 6, 6)
    assert "stopped early" in retried.message and _steps(launch) == [4, 6]


def test_a_retry_of_a_run_that_did_not_stop_early_trains_on(launch: AttemptLaunch) -> None:
    """Only a told stop ends the run short of spec.training.steps: a loop that left after step 4's
    checkpoint without one (as a crash would) is resumed there and trained to the end. Its report
    says it ended short and what its checkpoints keep; before, "trained 4 steps" alone."""
    assert _attempt(launch, 4, tell=False) == (0, False)
    assert _report(launch).message == (
        "trained 4 steps in fp32, short of spec.training.steps=10: the loop left without run.stop_early(step), "
        "its last checkpoint is step 4's"
    )
    assert _attempt(launch, None) == (4, False)
    assert _report(launch).step == 10 and _steps(launch)[-1] == 10


@pytest.mark.parametrize(("after", "at"), [(3, 3), (5, 11)])
def test_a_stop_after_a_closed_step_or_past_the_end_is_refused(launch: AttemptLaunch, after: int, at: int) -> None:
    """stop_early names a step the loop has not closed yet, within spec.training.steps."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mpjob.start(launch=launch) as run:
        run.resume(model=model, optimizer=optimizer)
        for step in range(1, after + 1):
            run.backward(model(torch.randn(8, 4)).pow(2).mean())
            run.step(optimizer)
            run.end_step(step, samples=8)
        with pytest.raises(ConfigError, match=rf"stop_early\({at}\): .* not closed yet \(it closed {after}\), up to"):
            run.stop_early(at)
    assert _steps(launch) == ([4] if after == 5 else [])  # the refused stop forced no checkpoint


@pytest.mark.parametrize(
    ("held", "problem"),
    [
        ({"step": 6}, None),
        ({"step": None}, None),
        ([6], "not {'step': a step or None}"),
        ({"step": 6, "more": 1}, "not {'step': a step or None}"),
        ({"step": 0}, "not a step"),
        ({"step": True}, "not a step"),
        ({"step": "6"}, "not a step"),
    ],
)
def test_a_checkpoints_stop_record_is_checked_before_it_is_taken(held: Any, problem: str | None) -> None:
    """What a checkpoint holds of the stop is read from a store: checked (a problem rejects the
    checkpoint whole, state.own_fields_problem) before it can end a run."""
    said = EarlyStop().state_problem(held)
    assert said is None if problem is None else problem in (said or "")


def test_a_stop_told_at_a_step_whose_interval_rolls_back_in_place_still_ends_the_run_there(
    launch: AttemptLaunch,
) -> None:
    """Step 6's loss is NaN in fp32: the read at step 7, where the loop stops early, skips its sample,
    rolls back to step 4 and catches up. The loop told its stop before that: step 7 stays the run's last,
    checkpointed with the stop. Before, the rollback loaded step 4's record (no stop): the run ended
    Succeeded on an unsaved step 7 whose report said the loop left without run.stop_early."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with mpjob.start(launch=launch) as run:
        run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            if i in run.quarantined:
                return
            loss = model(torch.randn(8, 4, generator=torch.Generator().manual_seed(i))).pow(2).mean()
            run.backward(loss * math.nan if i == 5 else loss)
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i])
        for i in range(7):
            one_step(i)
            if i + 1 == 7:
                run.stop_early(7)
            run.end_step(i + 1, samples=8)
    assert _steps(launch) == [4, 7]
    ended = _report(launch)
    assert ended.message == "trained 7 steps in fp32, stopped early there (the training's own stop)"
    assert ended.skipped is not None and ended.skipped.count == 1
    assert _attempt(launch, None) == (7, True)  # a retry from step 7's checkpoint: nothing left to train


def test_a_stop_told_before_a_step_that_runs_out_of_memory_in_place_still_ends_the_run_there(
    launch: AttemptLaunch,
) -> None:
    """The loop tells its stop at step 7 before running it; step 7 (index 6) runs out of memory,
    splits in place, rolls back to step 4 and catches up: step 7 stays the run's last, checkpointed
    with the stop. Before, the rollback loaded step 4's record (no stop), as a data-rung rollback did."""
    split = AttemptLaunch.model_validate(
        {**launch.model_dump(by_alias=True), "inPlaceSplits": [{"microBatch": 4, "gradAccumulation": 2}]}
    )
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    micro = [8]
    with mpjob.start(launch=split) as run:
        start = run.resume(model=model, optimizer=optimizer)

        def one_step(i: int) -> None:
            if i == 6 and micro[0] == 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 98.25 GiB")
            run.backward(model(torch.randn(micro[0], 4, generator=torch.Generator().manual_seed(i))).pow(2).mean())
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i], reshape=lambda m, a: micro.__setitem__(0, m))
        for i in range(start, 7):
            if i + 1 == 7:
                run.stop_early(7)
            run.run_step(i)
            run.end_step(i + 1, samples=8)
    assert micro == [4] and _steps(split) == [4, 7]
    assert _report(split).message == "trained 7 steps in fp32, stopped early there (the training's own stop)"
