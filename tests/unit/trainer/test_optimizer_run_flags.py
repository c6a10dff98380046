"""An optimizer's implementation flags (foreach, fused, capturable, differentiable) say how the
process runs its step, not what it trains: a checkpoint's never replace the run's. A checkpoint
written on a GPU with capturable=True, resumed by a run on the CPU, took the checkpoint's flag
with its group, and its first step failed (capturable wants CUDA), in every attempt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.optimizer_settings import RUN_FLAGS, with_run_flags
from mpjob_trainer.checkpoint.shards import restore_shards
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.test_sharded_optimizer_faults import NAMES, commit, objects

pytestmark = pytest.mark.unit

#: Flags a run on another device (a GPU) writes, as its groups hold them.
WRITTEN_ON_GPU = [{"capturable": True}, {"fused": True}, {"foreach": True, "differentiable": True}]


def stepped_state(seed: int) -> TrainingState:
    """A single-file run's state after one AdamW step from `seed`."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    return TrainingState({"model": model, "optimizer": optimizer})


def _step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(2, model[0].in_features)).sum().backward()
    optimizer.step()


def _flags(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [{key: group.get(key) for key in RUN_FLAGS} for group in optimizer.param_groups]


@pytest.mark.parametrize("written", WRITTEN_ON_GPU, ids=lambda flags: "+".join(flags))
def test_a_single_file_checkpoints_flags_do_not_replace_the_runs(tmp_path: Path, written: dict[str, Any]) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    state = stepped_state(5).capture(5, 5, "fp32", None)
    for group in state["optimizer"]["param_groups"]:
        group.update(written)  # as the GPU run's groups hold them
    _, read = store.verify(Path(store.write(5, "fp32", state).ref.path))
    run = stepped_state(0)
    own = _flags(run.objects["optimizer"])
    run.restore(read, "fp32", None)
    assert _flags(run.objects["optimizer"]) == own
    _step(run.objects["model"], run.objects["optimizer"])  # before: capturable's AssertionError on the CPU


@pytest.mark.parametrize("written", WRITTEN_ON_GPU, ids=lambda flags: "+".join(flags))
def test_a_sharded_checkpoints_flags_do_not_replace_the_runs(tmp_path: Path, written: dict[str, Any]) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    folder = commit(store, 10, **written)
    run = objects(0)
    own = _flags(run["optimizer"])
    restore_shards(folder, run, NAMES)
    assert _flags(run["optimizer"]) == own
    assert run["optimizer"].state_dict()["state"][0]["step"] == 1.0, "the checkpoint's state is loaded"
    torch.manual_seed(1)
    run["model"](torch.randn(2, 4)).sum().backward()
    run["optimizer"].step()


def test_a_resumed_group_keeps_its_keys_in_the_checkpoints_order() -> None:
    """The run's flags replace the checkpoint's where they stand: a resumed run's next checkpoint
    pickles its groups as an unbroken run's would (byte for byte: in place and restarted runs end
    in the same checkpoint), and a flag the checkpoint lacks goes last, as torch's load adds it."""
    live = torch.optim.AdamW(nn.Linear(3, 2).parameters(), lr=0.1).state_dict()["param_groups"][0]
    read = {**live, "capturable": True}
    assert list(with_run_flags(read, live)) == list(read)
    assert with_run_flags(read, live)["capturable"] is live["capturable"]
    lacking = {key: value for key, value in read.items() if key != "fused"}
    assert list(with_run_flags(lacking, live)) == [*lacking, "fused"]
