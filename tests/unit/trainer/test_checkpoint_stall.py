"""Checkpoints that do not stall: the state is staged into reusable host buffers, written off
the training thread exactly as it was at its step, the weights are checked with one host read,
and the training thread's share is measured (`checkpointStaged`)."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore, StagingBuffers
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.framework import FrameworkCheckpointer
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt)
    return model, opt


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    opt.zero_grad()
    model(torch.randn(4, 3)).square().sum().backward()
    opt.step()


def _tensors(state: Any, place: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return {place: state}
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else ()
    return {k: t for key, value in items for k, t in _tensors(value, (*place, key)).items()}


def test_staging_reuses_one_unpinned_buffer_per_cpu_tensor_across_saves() -> None:
    model, opt = _trained()
    staging = StagingBuffers()
    first = _tensors(staging.stage({"model": model.state_dict(), "optimizer": opt.state_dict()}).state)
    ptrs = {place: t.data_ptr() for place, t in first.items()}
    _step(model, opt)
    live = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    second = _tensors(staging.stage(live).state)
    assert ("optimizer", "state", 0, "exp_avg") in second and len(second) == len(ptrs) >= 10
    assert {place: t.data_ptr() for place, t in second.items()} == ptrs
    for place, tensor in _tensors(live).items():
        assert torch.equal(second[place], tensor), place
        assert second[place].data_ptr() != tensor.data_ptr(), "a copy, not the live tensor"
        assert not second[place].is_pinned(), "pinned memory is for CUDA tensors only"


def test_reserved_buffers_are_allocated_off_the_calling_thread_and_filled_by_the_first_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, opt = _trained()
    allocated_on: list[str] = []
    empty = torch.empty

    def recording_empty(*args: Any, **kw: Any) -> torch.Tensor:
        allocated_on.append(threading.current_thread().name)
        return empty(*args, **kw)

    monkeypatch.setattr(torch, "empty", recording_empty)
    staging = StagingBuffers()
    staging.reserve({"model": model.state_dict(), "optimizer": opt.state_dict()})
    staging.reserved()
    places = _tensors({"model": model.state_dict(), "optimizer": opt.state_dict()})
    reserved = {place: staging.buffer(place) for place in places}
    assert len(reserved) >= 10 and all(buffer is not None for buffer in reserved.values())
    assert allocated_on and threading.current_thread().name not in allocated_on
    _step(model, opt)
    staged = _tensors(staging.stage({"model": model.state_dict(), "optimizer": opt.state_dict()}).state)
    assert all(staged[place] is reserved[place] for place in places), "the first save fills what was reserved"
    assert len(allocated_on) == len(reserved), "and allocates nothing itself"
    assert torch.equal(staged[("model", "0.weight")], model[0].weight.detach())


def test_only_rank_0_reserves_staging_buffers_and_a_framework_none(tmp_path: Path) -> None:
    model, _ = _trained()
    for rank in (1, 0):
        checkpoints = Checkpointer(
            CheckpointStore(tmp_path / str(rank), keep=2, config_digest="d"),
            World(rank, 2, rank),
            EventLog(stream=io.StringIO()),
            TrainerMetrics("j", "ns", rank, "fp32"),
        )
        checkpoints.reserve(lambda: {"model": model.state_dict()})
        checkpoints.staging.reserved()
        assert (checkpoints.staging.buffer(("model", "0.weight")) is not None) is (rank == 0)
    framework = FrameworkCheckpointer(checkpoints, write=lambda folder: folder, model=model)
    framework.reserve(lambda: {"model": model.state_dict()})  # its saves are synchronous: no buffers
    framework.staging.reserved()
    assert framework.staging.buffer(("model", "0.weight")) is None


def test_a_tensor_that_changes_shape_or_dtype_gets_a_new_buffer_and_a_gone_one_is_dropped() -> None:
    staging = StagingBuffers()
    staging.stage({"w": torch.zeros(3), "b": torch.zeros(2), "gone": torch.zeros(1)})
    before = {name: staging.buffer((name,)) for name in ("w", "b")}
    staged = staging.stage({"w": torch.ones(4), "b": torch.ones(2, dtype=torch.float64)}).state
    assert torch.equal(staged["w"], torch.ones(4)) and staged["b"].dtype == torch.float64
    for name, old in before.items():
        assert old is not None and staging.buffer((name,)) is staged[name] is not old
    assert staging.buffer(("gone",)) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensors_stage_into_pinned_buffers_without_a_host_sync() -> None:
    weights, host = torch.randn(1 << 20, device="cuda"), torch.randn(4)
    expected = weights.clone()
    staging = StagingBuffers()
    staging.stage({"w": weights, "h": host})  # the first save allocates (pinning may sync)
    torch.cuda.set_sync_debug_mode("error")
    try:
        staged = staging.stage({"w": weights, "h": host})
        weights.add_(1.0)  # the next step, queued behind the copy
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert staged.state["w"].is_pinned() and not staged.state["h"].is_pinned()
    assert len(staged.events) == 1
    staged.ready()
    assert torch.equal(staged.state["w"], expected.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_after_a_reservation_the_first_cuda_stage_is_pinned_and_syncs_nothing() -> None:
    weights = torch.randn(1 << 20, device="cuda")
    staging = StagingBuffers()
    staging.reserve({"w": weights})
    staging.reserved()
    torch.cuda.set_sync_debug_mode("error")
    try:
        staged = staging.stage({"w": weights})
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert staged.state["w"].is_pinned()
    staged.ready()
    assert torch.equal(staged.state["w"], weights.cpu())


class _Held:
    """A Checkpointer whose background writes wait until `release` is set."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.store = CheckpointStore(root, keep=5, config_digest="d")
        self.release = threading.Event()
        self.out = io.StringIO()
        self.metrics = TrainerMetrics("j", "ns", 0, "fp32")
        write = self.store.write

        def delayed(*args: Any, **kwargs: Any) -> Any:
            assert self.release.wait(30), "never released"
            return write(*args, **kwargs)

        monkeypatch.setattr(self.store, "write", delayed)
        self.checkpoints = Checkpointer(self.store, World(0, 1, 0), EventLog(stream=self.out), self.metrics)

    def written(self, step: int) -> dict[str, Any]:
        return self.store.verify(self.store.root / f"step-{step:09d}")[1]

    def staged_events(self) -> list[dict[str, Any]]:
        events = [json.loads(line) for line in self.out.getvalue().splitlines()]
        return [e for e in events if e["event"] == "checkpointStaged"]


def _capture(step: int, weights: torch.Tensor, extra: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    return lambda: {"step": step, "w": weights, "extra": extra, "scaler": {"scale": 2.0**step}}


def test_what_is_written_is_the_state_at_its_step_though_training_mutates_it_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _Held(tmp_path, monkeypatch)
    weights = torch.arange(6.0)
    extra: dict[str, Any] = {"history": [1, 2], "data": {"position": 10, "order": [3, 1]}}
    held.checkpoints.save(10, "fp32", _capture(10, weights, extra), final=False)
    weights.add_(100.0)  # the next optimizer step, in place
    extra["history"].append(3)
    extra["data"]["position"] = 11
    extra["data"]["order"].reverse()
    held.release.set()
    held.checkpoints.collect(block=True, training_step=11)
    state = held.written(10)
    assert torch.equal(state["w"], torch.arange(6.0))
    assert state["extra"] == {"history": [1, 2], "data": {"position": 10, "order": [3, 1]}}
    assert state["scaler"] == {"scale": 1024.0} and held.checkpoints.failures == 0


def test_the_next_save_waits_for_the_previous_write_before_refilling_the_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = _Held(tmp_path, monkeypatch)
    weights, extra = torch.zeros(4), {"position": 10}
    held.checkpoints.save(10, "fp32", _capture(10, weights, extra), final=False)
    weights.fill_(20.0)
    extra["position"] = 20
    second = threading.Thread(
        target=held.checkpoints.save, args=(20, "fp32", _capture(20, weights, extra)), kwargs={"final": False}
    )
    second.start()
    second.join(0.3)
    assert second.is_alive(), "the second save did not wait for the first write"
    held.release.set()
    second.join(30)
    held.checkpoints.collect(block=True, training_step=20)
    assert torch.equal(held.written(10)["w"], torch.zeros(4)) and held.written(10)["extra"] == {"position": 10}
    assert torch.equal(held.written(20)["w"], torch.full((4,), 20.0)) and held.written(20)["extra"] == {"position": 20}
    stalls = {e["step"]: e["stallSeconds"] for e in held.staged_events()}
    assert stalls.keys() == {10, 20} and 0 <= stalls[10] < 0.3 <= stalls[20], "the wait is part of the stall"
    count = held.metrics.registry.get_sample_value("mpjob_trainer_checkpoint_stall_seconds_count", held.metrics.labels)
    assert count == 2


def test_a_final_save_is_written_before_save_returns_and_logs_no_stall(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    out = io.StringIO()
    checkpoints = Checkpointer(store, World(0, 1, 0), EventLog(stream=out), TrainerMetrics("j", "ns", 0, "fp32"))
    weights = torch.ones(3)
    checkpoints.save(30, "fp32", _capture(30, weights, {}), final=True)
    weights.zero_()
    ref = checkpoints.last_good
    assert ref is not None and ref.step == 30 and torch.equal(store.verify(Path(ref.path))[1]["w"], torch.ones(3))
    assert "checkpointStaged" not in out.getvalue()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("index", [0, 1, 2, 3])
def test_finite_catches_a_non_finite_value_in_any_one_parameter(index: int, value: float) -> None:
    model = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    state = TrainingState({"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})
    assert state.finite()
    with torch.no_grad():
        list(model.parameters())[index].view(-1)[-1] = value
    assert not state.finite()


def test_finite_reads_the_host_once_for_all_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(3)))  # six parameters
    state = TrainingState({"model": model})
    reads: list[str] = []

    def counting(name: str) -> Callable[..., Any]:
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any) -> Any:
            reads.append(name)
            return real(self, *args)

        return counted

    for name in ("__bool__", "item", "tolist", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name))
    assert state.finite()
    assert reads == ["__bool__"]


@pytest.mark.process
def test_the_trainer_logs_the_stall_of_every_periodic_checkpoint(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spec())  # 30 steps, a checkpoint every 10
    assert run.code == 0, run.stderr
    staged = run.of("checkpointStaged")
    assert [e["step"] for e in staged] == [10, 20], "30 is the final checkpoint: synchronous, no stall logged"
    assert all(isinstance(e["stallSeconds"], float) and e["stallSeconds"] >= 0 for e in staged), staged
    assert [e["step"] for e in run.of("checkpoint")] == [10, 20, 30]


def test_a_snapshot_copies_tensors_and_containers_and_shares_only_immutable_values() -> None:
    import random

    from mpjob_trainer.checkpoint.staging import snapshot

    weights = torch.ones(3)
    state = {"rng": random.Random(7).getstate(), "w": weights, "steps": [1, 2], "extra": {"tag": b"x"}}
    copied = snapshot(state)
    weights.add_(1)
    state["steps"].append(3)
    assert torch.equal(copied["w"], torch.ones(3))
    assert copied["steps"] == [1, 2]
    assert copied["rng"] == random.Random(7).getstate()
    assert copied["extra"] == {"tag": b"x"} and copied["extra"] is not state["extra"]
    replayed = random.Random()
    replayed.setstate(copied["rng"])
    assert replayed.random() == random.Random(7).random()
