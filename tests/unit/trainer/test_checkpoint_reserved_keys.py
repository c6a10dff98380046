"""Keys of a state that only the checkpoint reader sets, read from a file: a single-file
state.pt that held `shards` (and `shardedObjects`) pointed the restore at any folder's shards,
whose weights loaded unchecked for step, job or config; `heldInMemory` let a single file load
into a sharded model. Each is now the checkpoint's fault: the resume passes it over for the
good one before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint, resume
from mpjob_trainer.checkpoint.capture_keys import foreign_keys_problem
from mpjob_trainer.session.state import TrainingState

pytestmark = pytest.mark.unit


def run() -> TrainingState:
    torch.manual_seed(0)
    return TrainingState({"model": nn.Linear(3, 2)})


def write(store: CheckpointStore, step: int, planted: dict[str, Any] | None = None) -> Path:
    """A checkpoint of `step` with `planted` in its state before it is written (its sha256 the manifest's)."""
    state = {**run().capture(step, step, "fp32", None), **(planted or {})}
    return Path(store.write(step, "fp32", state).ref.path)


@pytest.mark.parametrize(
    "planted",
    [
        {"shards": "ELSEWHERE", "shardedObjects": {"module": "model"}},
        {"shardedObjects": {"module": "model"}},
        {"shardFiles": None},
        {"heldInMemory": True},
    ],
    ids=["shards", "sharded-objects", "shard-files", "held-in-memory"],
)
def test_a_single_file_holding_a_key_only_the_reader_sets_is_passed_over(tmp_path: Path, planted: dict) -> None:
    elsewhere = CheckpointStore(tmp_path / "other", keep=5, config_digest="another job's")
    foreign = write(elsewhere, 10)
    store = CheckpointStore(tmp_path / "ckpt", keep=5, config_digest="d")
    write(store, 5)
    key = next(iter(planted))
    forged = write(store, 10, {k: str(foreign) if v == "ELSEWHERE" else v for k, v in planted.items()})
    with pytest.raises(CorruptCheckpoint, match=f"holds '{key}', which no checkpoint of this layout writes"):
        store.verify(forged, alone=True)
    rejected: list[dict[str, Any]] = []
    store.log = lambda event, **f: rejected.append({"event": event, **f})
    target = run()
    loaded = resume.load(store, restore=lambda found: target.restore(found[1], "fp32", None))
    assert loaded is not None and loaded[0].step == 5
    assert [(r["event"], Path(r["path"]).name) for r in rejected] == [("checkpointRejected", "step-000000010")]


@pytest.mark.parametrize(
    ("state", "problem"),
    [
        ({"step": 3, "shardedObjects": {"module": "model", "optimizer": "opt"}}, None),
        ({"step": 3, "shardedObjects": {"module": "model"}}, None),
        ({"step": 3, "shardedObjects": {"module": "model"}, "heldInMemory": True}, "holds 'heldInMemory'"),
        ({"step": 3, "shardedObjects": {"module": "model"}, "shards": "/x"}, "holds 'shards'"),
        ({"step": 3}, None),  # the restore refuses it: it cannot tell which objects the shards hold
        ({"step": 3, "shardedObjects": ["model"]}, "not the names of its sharded objects"),
        ({"step": 3, "shardedObjects": {"optimizer": "opt"}}, "not the names of its sharded objects"),
        ({"step": 3, "shardedObjects": {"module": "model", "extra": "x"}}, "not the names of its sharded objects"),
        ({"step": 3, "shardedObjects": {"module": 7}}, "not the names of its sharded objects"),
    ],
    ids=["pair", "module", "in-memory", "shards", "unnamed", "a-list", "no-module", "an-extra", "not-a-name"],
)
def test_a_rank_file_names_its_sharded_objects_and_nothing_only_the_reader_sets(
    state: dict[str, Any], problem: str | None
) -> None:
    said = foreign_keys_problem(state, sharded=True)
    assert said == problem if problem is None else problem in (said or ""), said


def test_a_sharded_state_naming_no_sharded_objects_is_the_checkpoints_fault_not_a_crash() -> None:
    """Its restore read the names unchecked: a KeyError, taken for an infrastructure failure and
    met again by every retry, instead of the checkpoint before it."""
    state = {**run().capture(5, 5, "fp32", None), "shards": "/nowhere"}
    with pytest.raises(CorruptCheckpoint, match="the sharded checkpoint of step 5 names no sharded objects"):
        run().restore(state, "fp32", None)


@pytest.mark.parametrize(
    "names",
    [{"module": "opt", "optimizer": "model"}, {"module": "opt"}, {"module": "model", "optimizer": "model"}],
    ids=["swapped", "an-optimizer-as-the-module", "the-module-as-the-optimizer"],
)
def test_a_rank_file_naming_an_object_as_the_other_kind_is_the_checkpoints_fault_not_a_crash(names: dict) -> None:
    """A rank file's names of this run's objects, swapped: the restore asked DCP for an optimizer's
    state dict as a module's (an AttributeError, taken for a failure of the run and met again by
    every retry) instead of passing the checkpoint over for the one before it."""

    def trained() -> TrainingState:
        model = nn.Linear(3, 2)
        return TrainingState({"model": model, "opt": torch.optim.AdamW(model.parameters())})

    state = {**trained().capture(5, 5, "fp32", None), "shards": "/nowhere", "shardedObjects": names}
    with pytest.raises(CorruptCheckpoint, match=r"the sharded checkpoint of step 5 names .* as its sharded"):
        trained().restore(state, "fp32", None)
