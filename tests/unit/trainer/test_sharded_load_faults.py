"""What could still fail once DCP had read a sharded checkpoint, in torch's set_state_dict or the
first step after it, is told apart: a tensor the index lists as a plain value (DCP writes every
tensor as a tensor entry) is the checkpoint's fault before anything loads; an optimizer that
set_state_dict cannot load whatever the checkpoint (param groups without parameters) is a
ConfigError before anything loads; and what set_state_dict still refuses is the shards' fault,
read in part already (PartlyLoaded: the one before it is used, on every rank)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.state_dict import get_state_dict

from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint
from mpjob_trainer.checkpoint.manifest import PartlyLoaded, hash_files
from mpjob_trainer.checkpoint.shards import INDEX, rank_file, restore_shards
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.test_hostile_dcp_files import _recompute_manifest
from tests.unit.trainer.test_sharded_optimizer_faults import NAMES, resumed

pytestmark = pytest.mark.unit


class Versioned(nn.Module):
    """A layer that keeps a format version beside its weights (its extra state) and refuses one
    it does not know, as a module of a library may."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.version = 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)

    def get_extra_state(self) -> dict[str, int]:
        return {"version": self.version}

    def set_extra_state(self, state: Any) -> None:
        if state["version"] != 2:
            raise ValueError(f"format version {state['version']}: this layer reads version 2")


def weights_of(run: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in run["model"].state_dict().items() if isinstance(v, torch.Tensor)}


def built(seed: int, groups: int = 0) -> dict[str, Any]:
    """A model and its AdamW after one step; `groups`: that many more param groups, empty."""
    torch.manual_seed(seed)
    model = nn.Sequential(Versioned(), nn.LayerNorm(4))
    params = [{"params": list(model.parameters())}, *({"params": []} for _ in range(groups))]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer}


def commit(store: CheckpointStore, step: int, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    """A sharded checkpoint of one rank at `step` (its state dicts changed by `edit`), committed as
    the trainer commits one."""
    written = built(step)
    model_sd, optim_sd = get_state_dict(written["model"], [written["optimizer"]])
    state = {"model": model_sd, "optimizer": optim_sd}
    if edit is not None:
        edit(state)
    tmp = store.root / f".tmp-{step:09d}-0"
    dcp.save(state, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": step}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    return Path(store.commit(tmp, step, "bf16", files, world_size=1).ref.path)


def as_plain_value(folder: Path, fqn: str, value: torch.Tensor) -> None:
    """Make the index list `fqn` as a plain value, `value` pickled at the end of the shard file,
    its manifest recomputed to match."""
    with (folder / INDEX).open("rb") as f:
        index = pickle.load(f)  # our own, just written
    shard = folder / "__0_0.distcp"
    raw, pickled = shard.read_bytes(), io.BytesIO()
    torch.save(value, pickled)
    shard.write_bytes(raw + pickled.getvalue())
    old = next(key for key in index.storage_data if key.fqn == fqn)
    info = index.storage_data.pop(old)
    info.offset, info.length = len(raw), len(pickled.getvalue())
    index.storage_data[dcp_metadata.MetadataIndex(fqn)] = info
    index.state_dict_metadata[fqn] = dcp_metadata.BytesStorageMetadata()
    (folder / INDEX).write_bytes(pickle.dumps(index))
    _recompute_manifest(folder)


@pytest.mark.parametrize(
    "fqn",
    ["model.0.linear.weight", "optimizer.state.0.linear.weight.exp_avg", "optimizer.state.0.linear.weight.step"],
    ids=["weight", "moment", "step"],
)
def test_a_tensor_the_index_lists_as_a_plain_value_is_passed_over_before_anything_loads(
    tmp_path: Path, fqn: str
) -> None:
    """Before: the weight of another shape failed in set_state_dict (a RuntimeError, after DCP had
    read the rest into the model); the moment loaded and failed the first step of every attempt."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20)
    as_plain_value(newest, fqn, torch.zeros(3, 3) if not fqn.endswith("step") else torch.tensor(5.0))
    run = built(0)
    before = weights_of(run)
    with pytest.raises(CorruptCheckpoint, match=rf"step-000000020: its {fqn} is a tensor .* as a plain value"):
        restore_shards(newest, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"
    loaded, log = resumed(tmp_path, run)
    assert loaded is not None and loaded[0].step == 10 and "step-000000020" in log[0]["problem"], log
    run["model"](torch.randn(2, 4)).sum().backward()
    run["optimizer"].step()  # the one before it, whole: the first step runs


def test_an_optimizer_with_two_empty_groups_is_a_configuration_error_before_anything_loads(tmp_path: Path) -> None:
    """torch's set_state_dict loads at most one group without parameters: before, its ValueError
    came after DCP had read the shards into the model, whatever the checkpoint."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    run = built(10, groups=2)
    model_sd, optim_sd = get_state_dict(run["model"], [run["optimizer"]])
    tmp = store.root / ".tmp-000000010-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": 10}, tmp / rank_file(0))
    folder = Path(store.commit(tmp, 10, "bf16", hash_files(tmp, list(tmp.rglob("*"))), world_size=1).ref.path)
    run = built(0, groups=2)
    before = weights_of(run)
    with pytest.raises(ConfigError, match=r"this run's optimizer has 2 parameter groups without parameters"):
        restore_shards(folder, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"


def test_shards_a_module_refuses_once_read_are_passed_over_as_loaded_in_part(tmp_path: Path) -> None:
    """The layer's extra state reads as a plain value of its kind and the layer refuses it in
    set_state_dict, after DCP read the weights: before, its ValueError ended the attempt as an
    infrastructure failure on that rank; now the checkpoint, in part loaded, is passed over."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)

    def version_3(state: dict[str, Any]) -> None:
        state["model"]["0._extra_state"] = {"version": 3}

    newest = commit(store, 20, version_3)
    run = built(0)
    with pytest.raises(PartlyLoaded, match=r"step-000000020: its shards, read, do not load .*format version 3"):
        restore_shards(newest, run, NAMES)
    loaded, log = resumed(tmp_path, built(0))
    assert loaded is not None and loaded[0].step == 10 and "format version 3" in log[0]["problem"], log


class Misread(Versioned):
    """A layer whose set_extra_state has a bug: it reads a key its own get_extra_state never writes."""

    def set_extra_state(self, state: Any) -> None:
        self.version = state["verison"]


def test_a_module_that_cannot_take_back_its_own_extra_state_is_the_scripts_error(tmp_path: Path) -> None:
    """Before: set_state_dict's KeyError made every checkpoint PartlyLoaded, all passed over, and
    the attempt ended ResumedApart; now a ConfigError names the layer, before anything loads."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20)
    run = built(0)
    run["model"][0].__class__ = Misread
    before = weights_of(run)
    said = r"this run's model.0 \(Misread\) cannot take back its own extra state: its set_extra_state raised KeyError"
    with pytest.raises(ConfigError, match=said):
        restore_shards(newest, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"
    with pytest.raises(ConfigError, match=said):
        resumed(tmp_path, run)


def test_a_single_file_restore_holds_the_same_rule(tmp_path: Path) -> None:
    """Before: torch's load raised the KeyError after the weights before it were loaded."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    state = TrainingState(built(5)).capture(5, 5, "fp32", None)
    _, read = store.verify(Path(store.write(5, "fp32", state).ref.path))
    run = built(0)
    run["model"][0].__class__ = Misread
    before = weights_of(run)
    with pytest.raises(ConfigError, match=r"this run's model.0 \(Misread\) cannot take back its own extra state"):
        TrainingState(run).restore(read, "fp32", None)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"
