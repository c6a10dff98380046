"""A checkpoint damaged after its save is the checkpoint's fault, never the precision's: the fp32
replay (and the rollback after it) rejects it as a resume does (checkpointRejected) and goes
back to the one before it; with none before it the attempt ends an InfraError, retried in the
same precision, instead of a fallback down the ladder."""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, parse, spec, train_squares

pytestmark = pytest.mark.unit

BAD = 12  # step index with a non-finite sample; checkpoints every 5 steps
TENTH = "step-000000010"  # the checkpoint damaged after its save


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep: int, runs: int = 1) -> TerminationReport:
    """fp16 steps of a linear model; the first non-finite loss (step BAD's) ends the precision
    unless the fp32 replay blames the data; the checkpoint of step 10 is damaged when step 11
    runs the `runs`-th time (1: in training, before the replay; 2: in the replay, which loaded it
    already, before the rollback that loads it again)."""
    job = spec(
        training={"steps": 20, "batchSize": 4, "logEvery": 5},
        precision={"mode": "fp16", "guard": {"maxNonFiniteLosses": 1}},
        checkpoint={"everySteps": 5, "keep": keep},
    )
    with (
        contextlib.suppress(SystemExit),
        mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp16")) as run,
    ):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        start = run.resume(model=model, optimizer=optimizer)
        ran: dict[int, int] = {}

        def inputs(i: int) -> torch.Tensor:
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            if i == BAD and i not in run.quarantined:  # sample i, the bad one, left out once skipped
                x[0, 0] = math.nan
            ran[i] = ran.get(i, 0) + 1
            if i == BAD - 1 and ran[i] == runs:
                _damage(tmp_path / "ckpt" / TENTH)
            return x

        train_squares(run, model, optimizer, start, inputs)
    return TerminationReport.model_validate_json((tmp_path / "report.json").read_text())


def _damage(folder: Path, name: str = "state.pt") -> None:
    """Flip a byte of the file `name` (the state file) of the checkpoint in `folder` once it is
    committed (it is written in the background)."""
    deadline = time.monotonic() + 30
    while not (folder / "manifest.json").exists():
        assert time.monotonic() < deadline, f"{folder} was never committed"
        time.sleep(0.01)
    state = folder / name
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))


def _events(out: str, name: str) -> list[dict[str, Any]]:
    return [e for e in parse(out) if e["event"] == name]


def test_a_damaged_checkpoint_is_passed_over_for_the_one_before_it_and_the_precision_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _train(tmp_path, monkeypatch, keep=5)
    out = capsys.readouterr().out
    rejected = _events(out, "checkpointRejected")
    assert rejected and TENTH in rejected[0]["path"], rejected
    assert report.reason == "Succeeded", report.message
    assert report.precision == "fp16"
    skipped = _events(out, "dataSkipped")
    assert skipped and skipped[0]["steps"] == [BAD] and skipped[0]["fromStep"] == 5, skipped


def test_a_damaged_checkpoint_with_none_before_it_ends_the_attempt_as_the_checkpoints_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _train(tmp_path, monkeypatch, keep=1)
    assert report.reason == "InfraError", report.message
    assert TENTH in report.message, report.message
    assert _events(capsys.readouterr().out, "checkpointRejected")


def test_a_checkpoint_damaged_after_the_replay_loaded_it_is_passed_over_by_the_rollback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _train(tmp_path, monkeypatch, keep=5, runs=2)
    out = capsys.readouterr().out
    assert [e["verdict"] for e in _events(out, "replay")] == ["data"]  # from the checkpoint of step 10, whole
    rejected = _events(out, "checkpointRejected")
    assert len(rejected) == 1 and TENTH in rejected[0]["path"], rejected  # by the rollback's load
    assert report.reason == "Succeeded", report.message
    skipped = _events(out, "dataSkipped")
    assert skipped and skipped[0]["fromStep"] == 5, skipped


#: Replays off: the guard's verdict blames the precision at once, and the fallback in place is
#: the first to go back to the checkpoint (a replay would have found it damaged first).
IN_PLACE = spec(
    training={"steps": 8, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp16", "fallback": ["bf16"], "guard": {"maxNonFiniteLosses": 1, "replaySteps": 0}},
    checkpoint={"everySteps": 4, "keep": 5},
)
STOPPED, FAULT = 4, 5  # the first attempt stops after its checkpoint of step 4; step index 5 overflows


def _attempt(launch: AttemptLaunch, report: Path, *, stop: bool) -> TerminationReport:
    """fp16 steps of a linear model through `launch`; `stop`: the script raises at step index
    STOPPED (its checkpoint of step 4 written), else the resumed attempt damages that checkpoint at
    its first step and step index FAULT overflows once (the precision's fault)."""
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        start = run.resume(model=model, optimizer=optimizer)

        def inputs(i: int) -> torch.Tensor:
            if stop and i == STOPPED:
                raise RuntimeError("stopped by the test")
            if i == start and not stop:
                _damage(Path(launch.checkpoint_dir) / "step-000000004")  # resumed from: committed already
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
            x[0, 0] = math.inf if i == FAULT else x[0, 0]
            return x

        train_squares(run, model, optimizer, start, inputs)
    return TerminationReport.model_validate_json(report.read_text())


def test_a_fallback_in_place_that_finds_no_good_checkpoint_ends_in_the_precision_it_trained_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt is retried in the precision it trained in (an `auto` one's is the report's), so
    the report must not name the precision the fallback was going to and never trained in."""
    launch = in_process_launch(tmp_path, monkeypatch, IN_PLACE, "fp16")
    first = _attempt(launch, tmp_path / "report.json", stop=True)
    assert first.last_good_checkpoint is not None and first.last_good_checkpoint.step == STOPPED, first.message
    in_place = launch.model_copy(update={"attempt": 1, "in_place_to": [InPlaceTarget(precision="bf16")]})
    report = _attempt(in_place, tmp_path / "report.json", stop=False)
    assert report.reason == "InfraError" and "step-000000004" in report.message, report.message
    assert report.precision == "fp16" and report.precision_changes == [], report.precision
    assert (report.counters.overflow_steps, report.counters.non_finite_losses) == (1, 1)  # the fault's


def _sharded(launch: AttemptLaunch, report: Path, *, stop: bool) -> TerminationReport:
    """`_attempt`'s steps of the linear model sharded (FSDP2, a world of one), its loop run through
    run.reentering: a change in place leaves it, and it is wrapped anew in the next precision; the
    resumed attempt damages its rank's shards of the checkpoint of step 4."""
    with contextlib.suppress(SystemExit), mpjob.start(launch=launch) as run:

        def loop() -> None:
            torch.manual_seed(0)
            model = run.wrap(nn.Linear(4, 1))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)  # a state DCP saves as it is
            start = run.resume(model=model, optimizer=optimizer)

            def inputs(i: int) -> torch.Tensor:
                if stop and i == STOPPED:
                    raise RuntimeError("stopped by the test")
                if i == start and not stop:
                    _damage(Path(launch.checkpoint_dir) / "step-000000004", "__0_0.distcp")
                x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
                x[0, 0] = math.inf if i == FAULT else x[0, 0]
                return x

            train_squares(run, model, optimizer, start, inputs)

        run.reentering(loop)
    return TerminationReport.model_validate_json(report.read_text())


def test_a_sharded_model_wrapped_anew_that_finds_no_good_checkpoint_ends_in_the_precision_it_trained_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharded model changes precision in place by being wrapped anew, its resume() loading the
    checkpoint: when that finds none that loads, the report names the precision it trained in too."""
    launch = in_process_launch(tmp_path, monkeypatch, {**IN_PLACE, "parallelism": {"strategy": "fsdp"}}, "fp16")
    first = _sharded(launch, tmp_path / "report.json", stop=True)
    assert first.last_good_checkpoint is not None and first.last_good_checkpoint.step == STOPPED, first.message
    in_place = launch.model_copy(update={"attempt": 1, "in_place_to": [InPlaceTarget(precision="bf16")]})
    report = _sharded(in_place, tmp_path / "report.json", stop=False)
    assert report.reason == "InfraError" and "step-000000004" in report.message, report.message
    assert (report.precision, report.start_step, report.precision_changes) == ("fp16", STOPPED, []), report
    # the attempt it trained, counted as it ended: not one begun in bf16 before anything loaded
    assert (report.counters.overflow_steps, report.counters.non_finite_losses) == (1, 1), report.counters
