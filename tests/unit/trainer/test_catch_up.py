"""The catch-up after a rollback in place (session.catch_up) closes each step it runs again as the
loop's end_step closes it: the step lines it logs count its samples (samples/s, seconds per step),
and a re-promotion falling due on the way goes up in place as it does outside a catch-up, its
clean steps counted from the step that faulted."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, parse, spec, train_linear, train_squares

pytestmark = pytest.mark.unit


def test_the_steps_a_catch_up_logs_count_their_samples_as_the_loops_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bad sample at step 8 (index 7), seen at once (every step is read): rolled back to the
    # checkpoint at step 4, then steps 5..7 run again and logged by the catch-up.
    job = spec(training={"steps": 10, "batchSize": 4, "logEvery": 1}, checkpoint={"everySteps": 4})

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if i == 7 and i not in run.quarantined:
            x[0, 0] = math.nan
        return x

    report = train_linear(tmp_path, monkeypatch, job, "fp32", inputs)
    assert report.reason == "Succeeded" and report.skipped is not None, report.message

    lines = [e for e in parse(capsys.readouterr().out) if e["event"] == "step"]
    again = [e["step"] for e in lines][7:10]
    assert again == [5, 6, 7], [e["step"] for e in lines]  # the catch-up's, after steps 1..7
    for line in lines:
        assert line["samplesPerSecond"] is not None and line["samplesPerSecond"] > 0, line
        assert line["stepSeconds"] < 60, line


def test_a_preemption_while_catching_up_reports_the_step_the_catch_up_reached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM during the catch-up ends it at the step it closed, checkpointed there: the report
    names that step, not the loop's step whose fault began the rollback (which it never trained
    again: the next attempt resumes from the catch-up's checkpoint)."""
    job = spec(training={"steps": 10, "batchSize": 4, "logEvery": 1}, checkpoint={"everySteps": 4})

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if i == 7 and i not in run.quarantined:
            x[0, 0] = math.nan  # seen at step 8: rolled back to step 4's checkpoint
        if i == 5 and 7 in run.quarantined:
            run.preemption.raised = True  # while the catch-up runs step 6 again
        return x

    with pytest.raises(SystemExit):
        train_linear(tmp_path, monkeypatch, job, "fp32", inputs)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "Preempted", report.message
    assert report.last_good_checkpoint is not None and report.last_good_checkpoint.step == 6
    assert report.step == 6


def test_a_checkpoint_the_catch_up_writes_holds_its_own_steps_data_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The preemption above checkpoints step 6 while the loop stood at step 8: the next attempt
    resumes at step 6 and must draw step 7's samples next (6 steps x 4 samples consumed), not
    step 9's, which would leave steps 7 and 8's samples out of the run for good."""
    job = spec(training={"steps": 10, "batchSize": 4, "logEvery": 1}, checkpoint={"everySteps": 4})

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if i == 7 and i not in run.quarantined:
            x[0, 0] = math.nan
        if i == 5 and 7 in run.quarantined:
            run.preemption.raised = True
        return x

    with pytest.raises(SystemExit):
        train_linear(tmp_path, monkeypatch, job, "fp32", inputs)
    assert torch.load(tmp_path / "ckpt" / "step-000000006" / "state.pt")["samples"] == 6 * 4
    with contextlib.suppress(SystemExit), mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job)) as run:
        model = nn.Linear(4, 1)
        resumed = run.resume(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01)), run.samples_seen
    assert resumed == (6, 6 * 4)


#: fp16 falls back to bf16 in place, which re-promotes to fp16 in place after 2 clean steps.
PROMOTE = InPlaceTarget(precision="bf16", repromote_after_steps=2, promote_to=InPlaceTarget(precision="fp16"))
#: Steps 5..7 overflow in fp16 the first time they run (a transient overflow); three non-finite
#: losses end fp16 at the read of step 8, while the last good checkpoint is step 4's.
REPROMOTING = spec(
    training={"steps": 16, "batchSize": 4, "logEvery": 2},
    precision={"mode": "fp16", "fallback": ["bf16"], "guard": {"onBadData": "fail"}},
    checkpoint={"everySteps": 2},
)


def train(launch: AttemptLaunch, overflowed: set[int]) -> TerminationReport:
    """`train_squares` through `launch` in this process, to its end (an exit other than success is
    its report's); steps 5..7 overflow the first time fp16 runs them (`overflowed`: those it ran)."""

    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if run.precision == "fp16" and i in (4, 5, 6) and i not in overflowed:
            overflowed.add(i)
            x[0, 0] = math.inf
        return x

    return run_through(launch, inputs)


def test_a_repromotion_due_while_catching_up_goes_up_in_place_and_ends_as_the_restart_path_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp16 = in_process_launch(tmp_path, monkeypatch, REPROMOTING, "fp16")
    # bf16 catches up from step 4 to 8 in place; its clean steps count from the fault at step 8, so its
    # re-promotion falls due at step 10's checkpoint, past the steps that overflowed.
    in_place = fp16.model_copy(update={"checkpoint_dir": str(tmp_path / "inplace"), "in_place_to": [PROMOTE]})
    report = train(in_place, set())
    assert report.reason == "Succeeded" and report.precision == "fp16", report.message
    changes = [(c.kind, c.to_precision, c.start_step) for c in report.precision_changes]
    assert changes == [("fallback", "bf16", 4), ("repromote", "fp16", 10)]

    # The restart path: fp16 ends at step 8, bf16 from step 4 (its clean steps counted from 8, as the
    # planner launches a fallback) ends Repromote at 10, fp16 from 10 to the end.
    overflowed: set[int] = set()
    restart = fp16.model_copy(update={"checkpoint_dir": str(tmp_path / "restart")})
    assert train(restart, overflowed).reason == "NumericFault"
    bf16 = restart.model_copy(update={"attempt": 1, "precision": "bf16", "repromote_after_steps": 2,
                                      "repromote_counts_from": 8,
                                      "resume_from": str(tmp_path / "restart" / "step-000000004")})  # fmt: skip
    assert train(bf16, overflowed).reason == "Repromote"
    again = bf16.model_copy(update={"attempt": 2, "precision": "fp16", "repromote_after_steps": None,
                                    "repromote_counts_from": None,
                                    "resume_from": str(tmp_path / "restart" / "step-000000010")})  # fmt: skip
    assert train(again, overflowed).reason == "Succeeded"
    ours, theirs = (torch.load(tmp_path / d / "step-000000016" / "state.pt")["model"] for d in ("inplace", "restart"))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_catch_up_goes_back_up_only_past_the_step_that_faulted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp16 overflows at steps 5..9 whenever it runs them (not a passing overflow): its fault at
    step 8 goes back to step 4's checkpoint in bf16, whose 2 clean steps count from step 8, not 4,
    so it goes back up at step 10, past the trouble, rather than at 6 to fault again and be barred."""
    fp16 = in_process_launch(tmp_path, monkeypatch, REPROMOTING, "fp16")

    def trouble(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        if run.precision == "fp16" and 4 <= i <= 8:
            x[0, 0] = math.inf
        return x

    in_place = fp16.model_copy(update={"checkpoint_dir": str(tmp_path / "inplace"), "in_place_to": [PROMOTE]})
    report = run_through(in_place, trouble)
    changes = [(c.kind, c.to_precision, c.start_step) for c in report.precision_changes]
    assert changes == [("fallback", "bf16", 4), ("repromote", "fp16", 10)], report.message
    assert report.reason == "Succeeded" and report.precision == "fp16", report.message


def run_through(launch: AttemptLaunch, inputs: Callable[[mpjob.Session, int], torch.Tensor]) -> TerminationReport:
    """`train_squares` through `launch` in this process with `inputs(run, step index)`, to its end."""
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)
        train_squares(run, model, optimizer, start, lambda i: inputs(run, i))
    return TerminationReport.model_validate_json(Path(os.environ["MPJOB_TERMINATION_LOG"]).read_text())
