"""The fp32 replay: a numeric fault is replayed in fp32 before a precision is given up, to
tell bad data (or a broken model) from a precision that cannot go on."""

from __future__ import annotations

from pathlib import Path

import pytest

from mpjob_contract.codes import ExitCode
from mpjob_contract.report import Replay
from mpjob_trainer.session.replay import window
from mpjob_trainer.session.verdict import describe
from tests.unit.trainer.conftest import run_trainer, spec
from tests.unit.trainer.test_numerics import OVERFLOWING

pytestmark = pytest.mark.unit

MLP = {"inputs": 8, "hidden": 16, "samples": 512}


def poisoned(samples: object, **over: object) -> dict:
    """guard.onBadData fail: the attempt ends on the replay's verdict (test_data_rung: skip)."""
    guard = {"onBadData": "fail", **over.pop("guard", {})}  # type: ignore[dict-item]
    return spec(
        task={"builtin": "mlp", "args": {**MLP, "samples": 64, "nonFiniteSamples": samples}},  # ~8 epochs
        precision={"mode": "fp16", "guard": guard, **over},
        training={"steps": 60, "batchSize": 8, "logEvery": 5},
    )


@pytest.mark.process
def test_a_poisoned_sample_ends_the_attempt_as_non_finite_in_fp32_naming_step_and_samples(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, poisoned([30]), "fp16")
    assert run.code == ExitCode.NON_FINITE_IN_FP32, run.stderr
    report = run.report
    assert report is not None and report.reason == "NonFiniteInFp32" and report.replay is not None
    replay = report.replay
    assert replay.verdict == "data" and replay.from_checkpoint
    assert 30 in replay.samples and len(replay.samples) == 8  # the offending step's batch
    assert replay.offending_step is not None and report.last_good_checkpoint is not None
    assert report.last_good_checkpoint.step <= replay.offending_step < report.step
    assert f"step {replay.offending_step + 1} is non-finite too" in report.message and "30" in report.message
    assert [e["verdict"] for e in run.of("replay")] == ["data"]


@pytest.mark.process
def test_data_poisoned_from_the_first_step_replays_the_weights_in_memory(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, poisoned("all"), "fp16")
    assert run.code == ExitCode.NON_FINITE_IN_FP32, run.stderr
    replay = run.report.replay if run.report else None
    assert replay is not None and replay.verdict == "data"
    assert not replay.from_checkpoint and replay.offending_step == 0 and replay.steps == 1


@pytest.mark.process
def test_a_precision_overflow_replays_finite_in_fp32_and_stays_a_numeric_fault(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING, precision={"mode": "fp16"}), "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    replay = run.report.replay if run.report else None
    assert replay is not None and replay.verdict == "precision" and replay.from_checkpoint
    assert replay.first_step == 25 and replay.steps == 4  # steps 22-25, from the checkpoint at 20
    assert "the precision is at fault" in run.report.message  # type: ignore[union-attr]


@pytest.mark.process
def test_with_replays_off_a_poisoned_fp16_attempt_blames_the_precision(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, poisoned([30], guard={"replaySteps": 0}), "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    assert run.report is not None and run.report.replay is None and run.of("replay") == []


@pytest.mark.process
def test_out_of_device_memory_exits_46_and_a_smaller_micro_batch_trains(tmp_path: Path) -> None:
    job = spec(task={"builtin": "mlp", "args": {**MLP, "outOfMemoryAbove": 4}}, training={"batchSize": 8})
    too_big = run_trainer(tmp_path / "a0", job, "bf16")
    assert too_big.code == ExitCode.OUT_OF_DEVICE_MEMORY, too_big.stderr
    assert too_big.report is not None and too_big.report.reason == "OutOfDeviceMemory"
    assert "outOfMemoryAbove=4" in too_big.report.message
    fits = run_trainer(tmp_path / "a1", job, "bf16", shape=(4, 2))
    assert fits.code == 0, fits.stderr


@pytest.mark.parametrize(
    ("first", "checkpoint", "steps", "expected", "from_checkpoint"),
    [
        (25, 20, 4, range(22, 26), True),
        (21, 20, 4, range(20, 22), True),  # not before the checkpoint
        (3, None, 4, range(3, 4), False),  # no checkpoint: the faulting step from memory
        (3, 10, 4, range(3, 4), False),  # a checkpoint after the fault is no start
    ],
)
def test_the_replay_window_ends_at_the_first_faulting_step(
    first: int, checkpoint: int | None, steps: int, expected: range, from_checkpoint: bool
) -> None:
    win = window(first, checkpoint_step=checkpoint, replay_steps=steps)
    assert (win.steps, win.from_checkpoint) == (expected, from_checkpoint)


@pytest.mark.process
def test_the_report_names_the_attempts_precision_not_the_replays(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec(**OVERFLOWING, precision={"mode": "fp16"}), "fp16")
    assert run.report is not None and run.report.replay is not None
    assert run.report.precision == "fp16"


def overflowing_from(step: int) -> dict:
    """OVERFLOWING's fp16 overflow from `step` on: one non-finite loss by the read at 30 (a
    suspect, replayed at once), the guard's bound at the read at 35."""
    task = {**OVERFLOWING["task"], "args": {**OVERFLOWING["task"]["args"], "overflowAtStep": step}}
    return spec(**{**OVERFLOWING, "task": task}, precision={"mode": "fp16"})


@pytest.mark.process
@pytest.mark.parametrize("in_place_to", [None, ["bf16"]])
def test_steps_fp32_cleared_as_a_suspect_are_not_replayed_again_when_the_guard_ends_the_precision(
    tmp_path: Path, in_place_to: list[str] | None
) -> None:
    run = run_trainer(tmp_path, overflowing_from(29), "fp16", in_place_to=in_place_to)
    (replay,) = run.of("replay")  # the suspect's: its verdict stands for the guard's fault
    assert (replay["verdict"], replay["firstStep"], replay["steps"]) == ("precision", 29, 4)
    if in_place_to is None:
        assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
        assert run.report is not None and run.report.replay is not None and run.report.replay.first_step == 29
        assert "fp32 replayed steps 27-30 finitely: the precision is at fault" in run.report.message
        assert run.report.last_good_checkpoint is not None and run.report.last_good_checkpoint.step == 20
        return
    assert run.code == ExitCode.SUCCESS, run.stderr
    (changed,) = run.of("precisionChanged")
    assert changed["startStep"] == 20 and "fp32 replayed steps 27-30 finitely" in changed["message"]


@pytest.mark.parametrize(
    ("first", "checkpoint", "said"),
    [
        (15, 15, "fp32 replayed step 16 finitely"),  # cut short at the attempt's start: one step
        (25, 20, "fp32 replayed steps 23-26 finitely"),
        (3, None, "fp32 replayed step 4 finitely"),  # no checkpoint: the faulting step from memory
    ],
)
def test_the_precision_verdict_names_the_steps_fp32_replayed(first: int, checkpoint: int | None, said: str) -> None:
    win = window(first, checkpoint_step=checkpoint, replay_steps=4)
    replay = Replay(verdict="precision", first_step=first, steps=len(win.steps))
    assert describe(replay, "MaxNonFiniteLosses: m") == f"MaxNonFiniteLosses: m; {said}: the precision is at fault"


def test_a_later_window_starts_after_the_steps_fp32_replayed_finitely_already() -> None:
    win = window(31, checkpoint_step=20, replay_steps=4, after=29)
    assert (win.steps, win.from_checkpoint) == (range(30, 32), True)


@pytest.mark.process
def test_steps_a_suspects_replay_ran_past_its_time_cap_are_not_replayed_again(tmp_path: Path) -> None:
    slow = {**MLP, "overflowAtStep": 29, "stepDelay": {"fp32": 1.2}}  # each fp32 step past the 1 s cap
    job = spec(
        task={"builtin": "mlp", "args": slow},
        precision={"mode": "fp16", "guard": {"replayTimeoutSeconds": 1}},
        training={"steps": 40, "batchSize": 8, "logEvery": 5},
    )
    run = run_trainer(tmp_path, job, "fp16")
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr
    (replay,) = run.of("replay")  # the suspect's: the guard's fault at step 35 does not spend the cap again
    assert (replay["verdict"], replay["firstStep"], replay["steps"]) == ("inconclusive", 29, 1)
    assert run.report is not None and "no fp32 replay could tell (inconclusive)" in run.report.message
