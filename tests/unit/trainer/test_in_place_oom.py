"""Out of device memory in the running process (session.memory): the step that did not fit goes
on in the next smaller split the launch names, again while splits are left; at the smallest one,
or where the attempt cannot agree or reshape, the attempt ends OutOfDeviceMemory and restarts."""

from __future__ import annotations

import weakref
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.api import Guard, PrecisionSpec
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import session as mpjob
from mpjob_trainer.distributed import World
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.session import memory as memory_path
from mpjob_trainer.session.memory import SmallerMicroBatch, free
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.steps import StepNumerics
from tests.unit.trainer.conftest import in_process_launch, run_trainer, spec

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
        SimpleNamespace(objects={"model": model, "optimizer": optimizer}),  # type: ignore[arg-type]
        StepNumerics(precision, NumericGuard(Guard(), torch.device("cpu"), World(rank=0, size=1, local_rank=0))),
    )
    assert all(p.grad is None for p in model.parameters())
    precision.scaler.scale(model(torch.ones(2, 4)).sum()).backward()
    precision.scaler.unscale_(optimizer)  # would raise "unscale_() has already been called"
    precision.scaler.step(optimizer)
    precision.scaler.update()


def test_the_step_after_an_out_of_memory_in_the_optimizers_step_updates_the_scale_of_its_own_unscale() -> None:
    """run.step() unscaled, then the optimizer's step ran out of memory: the step run again in
    the new split with the fresh GradScaler is a first step, not a second one of the failed step
    (whose scale update, due on a GradScaler that is gone, found no inf checks on the new one)."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = AttemptPrecision("fp16", torch.device("cpu"), PrecisionSpec())
    numerics = StepNumerics(precision, NumericGuard(Guard(), torch.device("cpu"), World(rank=0, size=1, local_rank=0)))
    numerics.backward(model(torch.ones(2, 4)).sum())

    def out_of_memory(*_: Any, **__: Any) -> None:
        raise torch.OutOfMemoryError("allocating the optimizer's state")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optimizer, "step", out_of_memory)
        with pytest.raises(torch.OutOfMemoryError):
            numerics.step(optimizer, None)
    free(SimpleNamespace(objects={"model": model, "optimizer": optimizer}), numerics)  # type: ignore[arg-type]
    numerics.backward(model(torch.ones(2, 4)).sum())
    numerics.step(optimizer, None)  # its unscale_ first updated the scale the failed step left due
    assert numerics.close(1, 1.0) is None
    assert numerics.applied.count == 1 and precision.scaler is not None and precision.scaler.get_scale() == 65536.0


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


def test_what_the_step_that_ran_out_of_memory_computed_is_gone_before_the_cache_is_handed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failed step's activations (its frames' locals, and the autograd graph that saves them)
    are freed by reference count alone before release_cached hands the allocator's blocks back: on a
    GPU, what is still held then is held through every step of the next split."""
    job = spec(training={"steps": 4, "batchSize": 8}, checkpoint={"everySteps": 2})
    launched = in_process_launch(tmp_path, monkeypatch, job).model_dump(by_alias=True)
    launch = AttemptLaunch.model_validate({**launched, "inPlaceSplits": [{"microBatch": 4, "gradAccumulation": 2}]})
    failed: list[weakref.ref[torch.Tensor]] = []
    alive_at_release: list[bool] = []
    release = memory_path.release_cached

    def released(device: torch.device) -> None:
        alive_at_release.extend(ref() is not None for ref in failed)  # before its gc.collect()
        release(device)

    monkeypatch.setattr(memory_path, "release_cached", released)
    with mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start, micro = run.resume(model=model, optimizer=optimizer), [8]

        def one_step(i: int) -> None:
            with run.autocast():
                hidden = model(torch.ones(micro[0], 4)).expand(micro[0], 4096).sin()  # sin() saves its input
                if i == 3 and micro[0] == 8:
                    failed.append(weakref.ref(hidden))
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 98.25 GiB")
                loss = hidden.pow(2).mean()
            run.backward(loss)
            run.step(optimizer)

        run.register_step(one_step, samples=lambda i: [i], reshape=lambda m, a: micro.__setitem__(0, m))
        for i in range(start, run.total_steps):
            run.run_step(i)
            run.end_step(i + 1, samples=8)
    assert micro == [4] and alive_at_release == [False]
