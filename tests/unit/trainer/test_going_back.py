"""checkpoint.resume.back_to: a run going back to its last good checkpoint takes it by the resume's
rule (first_valid): one that does not verify or load is rejected for the one before it and
remembered unloadable; with none left NoGoodCheckpoint (an InfraError), never a raw error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore, resume
from mpjob_trainer.checkpoint.manifest import PartlyLoaded
from mpjob_trainer.checkpoint.resume import Loaded

pytestmark = pytest.mark.unit


def _store(root: Path, steps: tuple[int, ...] = (10, 20, 30)) -> tuple[CheckpointStore, list[dict]]:
    rejected: list[dict] = []
    store = CheckpointStore(root, keep=5, config_digest="d1", log=lambda e, **f: rejected.append(f))
    for step in steps:
        store.write(step, "fp16", {"step": step, "w": torch.full((4,), float(step))})
    return store, rejected


def _loads_in_part_at(*bad: int) -> tuple[list[int], resume.Restore]:
    tried: list[int] = []

    def restore(loaded: Loaded) -> None:
        tried.append(loaded[0].step)
        if loaded[0].step in bad:
            raise PartlyLoaded(f"step {loaded[0].step}: a shard did not load")

    return tried, restore


def test_a_checkpoint_that_loads_in_part_is_remembered_unloadable_and_the_one_before_it_taken(tmp_path: Path) -> None:
    store, rejected = _store(tmp_path)
    tried, restore = _loads_in_part_at(20)
    ref, state = resume.back_to(store, 20, restore)
    assert (ref.step, state["step"]) == (10, 10)
    assert tried == [20, 10]  # the checkpoint of step 30, after the one gone back to, is never tried
    assert store.unloadable == {tmp_path / "step-000000020"}
    assert rejected and "a shard did not load" in rejected[0]["problem"]


def test_a_save_of_the_unloadable_ones_step_sets_it_aside_rather_than_keeping_it(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    resume.back_to(store, 20, _loads_in_part_at(20)[1])
    store.write(20, "fp16", {"step": 20, "w": torch.zeros(4)})
    assert [p.name.startswith(".corrupt-step-000000020") for p in store.aside()] == [True]
    assert torch.equal(store.verify(tmp_path / "step-000000020")[1]["w"], torch.zeros(4))


def test_none_that_loads_ends_in_no_good_checkpoint_naming_the_step(tmp_path: Path) -> None:
    store, _ = _store(tmp_path, steps=(10, 20))
    with pytest.raises(resume.NoGoodCheckpoint, match="at or before step 20"):
        resume.back_to(store, 20, _loads_in_part_at(10, 20)[1])
    assert store.unloadable == {tmp_path / "step-000000010", tmp_path / "step-000000020"}
