"""A sharded checkpoint written by another optimizer configuration (SGD's group where the run's
AdamW needs betas and eps, three betas where the run's optimizer keeps two) is a ConfigError in
the single-file checkpoint's words (checkpoint.optimizer_settings' `foreign_setting`, told from
DCP's index before anything loads): never passed over, which would start the job at step 0, nor
DCP's missing key, which said the model changed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.shards import restore_shards
from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.test_sharded_optimizer_faults import NAMES, committed, objects, resumed, weights_of
from tests.unit.trainer.test_sharding import ranks

pytestmark = pytest.mark.unit

Make = Callable[[Any], torch.optim.Optimizer]


def sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adamw(params: Any) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=0.1)


def built(seed: int, make: Make, *, steps: int = 1) -> dict[str, Any]:
    """`objects(seed)` with the optimizer `make` builds, after `steps` steps (its state written)."""
    model = objects(seed)["model"]
    optimizer = make(model.parameters())
    for _ in range(steps):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    return {"model": model, "optimizer": optimizer}


def commit(store: CheckpointStore, step: int, make: Make, **group: Any) -> Path:
    """A sharded checkpoint of one rank at `step` of a run on `make`'s optimizer, its param group
    holding `group` besides, committed as the trainer commits one."""
    return committed(store, step, built(step, make), **group)


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ({"make": sgd}, r"param group 0 lacks betas, eps \(it holds dampening, momentum, nesterov\)"),
        (
            {"make": adamw, "betas": (0.9, 0.92, 0.99)},
            r"param group 0 holds betas of 3 items where this run's optimizer holds 2",
        ),
    ],
    ids=["sgd-then-adamw", "three-betas-then-adamw"],
)
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "stepped"])
def test_a_sharded_checkpoint_of_another_optimizer_configuration_stops_naming_the_setting(
    tmp_path: Path, written: dict[str, Any], said: str, fresh: bool
) -> None:
    """Before, DCP's 'Missing key in checkpoint state_dict: optimizer.state.0.weight.step' (a
    ConfigError saying the model changed) or, for three betas, CorruptCheckpoint: every checkpoint
    passed over and the job back at step 0. `fresh`: the run's optimizer has taken no step yet."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10, **written)
    newest = commit(store, 20, **written)
    run = built(0, adamw, steps=0 if fresh else 1)
    before = weights_of(run)
    wording = rf"step-000000020: its 'optimizer' {said}: it was written by another optimizer configuration than "
    with pytest.raises(ConfigError, match=wording + r"this run's AdamW \(the optimizer or its settings changed\)"):
        restore_shards(newest, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"
    with pytest.raises(ConfigError, match=wording):  # not passed over for the one before it, nor for step 0
        resumed(tmp_path, run)


def test_the_same_optimizer_with_other_values_still_loads(tmp_path: Path) -> None:
    """Another lr and betas, a flag set: the same configuration, its values taken (the flag, how
    this process runs the step, stays the run's own)."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    folder = commit(store, 10, adamw, lr=0.5, betas=(0.8, 0.99), foreach=False)
    run = built(0, adamw)
    restore_shards(folder, run, NAMES)
    group = run["optimizer"].param_groups[0]
    assert (group["lr"], group["betas"], group["foreach"]) == (0.5, (0.8, 0.99), None)


@pytest.mark.process
def test_every_rank_of_an_fsdp_run_stops_alike_on_an_sgd_checkpoint(tmp_path: Path) -> None:
    """FSDP2 over two gloo processes: a sharded SGD checkpoint resumed into AdamW ends each rank
    with the same ConfigError, none waiting alone in DCP's load."""
    seen = ranks(tmp_path, "optimizer_switched", 2)
    assert [rank["error"] for rank in seen] == ["ConfigError", "ConfigError"], seen
    assert all("param group 0 lacks betas, eps" in rank["message"] for rank in seen), seen
    assert all(rank["unchanged"] for rank in seen), seen


@pytest.mark.process
def test_a_rank_that_cannot_read_the_index_before_the_load_ends_the_resume_on_every_rank(tmp_path: Path) -> None:
    """The checks before DCP loads are agreed: the rank whose read failed raises its error, the
    other PeerFailed, neither waiting alone in a collective (before, the other rank sat in DCP's
    load while the failed one waited in the resume's agreement)."""
    seen = ranks(tmp_path, "restore_check_fails_on_one_rank", 2)
    assert [rank["error"] for rank in seen] == ["PeerFailed", "OSError"], seen
    assert "rank 1" in seen[0]["message"] and "timed out" in seen[0]["message"], seen
