"""Out of device memory in the running process (session.memory): the step that did not fit goes
on in the next smaller split the launch names, again while splits are left; at the smallest one,
or where the attempt cannot agree or reshape, the attempt ends OutOfDeviceMemory and restarts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from mpjob_contract.api import PrecisionSpec
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.session.memory import SmallerMicroBatch, free
from mpjob_trainer.session.modes import AttemptPrecision
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

SPLITS = [(4, 2), (2, 4), (1, 8)]


def tight(limit: int) -> dict[str, Any]:
    return spec(task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 512, "outOfMemoryAbove": limit,
                                                 "outOfMemoryFromStep": 12}},
                precision={"mode": "fp16", "fallback": ["bf16"]})  # fmt: skip


@pytest.mark.process
def test_an_out_of_memory_splits_in_place_again_until_the_step_fits(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, tight(2), "fp16", splits=SPLITS)
    assert run.code == ExitCode.SUCCESS, run.stderr
    assert len(run.of("start")) == 1
    made = [(c["kind"], c["attempt"], c["microBatch"], c["gradAccumulation"], c["startStep"], c["step"])
            for c in run.of("precisionChanged")]  # fmt: skip
    assert made == [("microBatch", 1, 4, 2, 10, 12), ("microBatch", 2, 2, 4, 10, 12)]
    assert all(c["fromPrecision"] == c["toPrecision"] == "fp16" for c in run.of("precisionChanged"))
    assert run.report is not None and [c.micro_batch for c in run.report.precision_changes] == [4, 2]


@pytest.mark.process
def test_an_out_of_memory_at_the_smallest_split_ends_the_attempt(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, tight(2), "fp16", splits=SPLITS[:1])
    assert run.code == ExitCode.OUT_OF_DEVICE_MEMORY, run.stderr
    assert run.report is not None and [c.micro_batch for c in run.report.precision_changes] == [4]
    assert run.report.reason == "OutOfDeviceMemory" and run.report.start_step == 10


@pytest.mark.process
def test_without_splits_an_out_of_memory_ends_the_attempt_as_before(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, tight(4), "fp16")
    assert run.code == ExitCode.OUT_OF_DEVICE_MEMORY and run.of("precisionChanged") == [], run.stderr


def memory(*, distributed: bool, reshape: bool) -> SmallerMicroBatch:
    launch = AttemptLaunch.model_validate({"jobName": "t", "precision": "fp16", "spec": tight(4)})
    context = SimpleNamespace(world=SimpleNamespace(distributed=distributed))
    in_place = SimpleNamespace(splits=[object()], why_not=None, why_not_split=None)
    made = SmallerMicroBatch(None, in_place, context, launch)  # type: ignore[arg-type]
    made.arm((lambda micro, accumulation: None) if reshape else None)
    return made


def test_several_ranks_or_a_loop_that_cannot_reshape_restart_saying_why() -> None:
    assert memory(distributed=False, reshape=True).why_restart() is None
    assert "several ranks" in (memory(distributed=True, reshape=True).why_restart() or "")
    assert "no reshape" in (memory(distributed=False, reshape=False).why_restart() or "")


def test_an_out_of_memory_inside_the_scalers_step_leaves_a_scaler_that_steps_again() -> None:
    """The first optimizer step allocates its state: an out-of-memory there comes after
    `unscale_`, and a GradScaler that kept that stage would refuse the next step's `unscale_`."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = AttemptPrecision("fp16", torch.device("cpu"), PrecisionSpec())
    assert precision.scaler is not None
    precision.scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    precision.scaler.unscale_(optimizer)  # then the step ran out of memory
    free(
        SimpleNamespace(objects={"model": model, "optimizer": optimizer}),
        SimpleNamespace(precision=precision, tally=[]),
    )  # type: ignore[arg-type]
    assert all(p.grad is None for p in model.parameters())
    precision.scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    precision.scaler.unscale_(optimizer)  # would raise "unscale_() has already been called"
    precision.scaler.step(optimizer)
    precision.scaler.update()


@pytest.mark.process
def test_an_out_of_memory_at_a_fresh_attempts_first_step_splits_in_place(tmp_path: Path) -> None:
    """No step has closed yet: the split restores the fresh start's step 0 and runs step 0 in it."""
    job = tight(2)
    job["task"]["args"].pop("outOfMemoryFromStep")  # from the very first forward pass
    run = run_trainer(tmp_path, job, "fp16", splits=SPLITS)
    assert run.code == ExitCode.SUCCESS, run.stderr
    made = [(c["microBatch"], c["startStep"], c["step"]) for c in run.of("precisionChanged")]
    assert made == [(4, 0, 0), (2, 0, 0)]
    assert run.report is not None and run.report.step == 30
    started = run_trainer(tmp_path / "split", job, "fp16", shape=(2, 4))  # an attempt started in that split
    assert started.code == ExitCode.SUCCESS, started.stderr
    assert [s["loss"] for s in run.of("step")] == [s["loss"] for s in started.of("step")]  # from the initial weights
