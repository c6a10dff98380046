"""A sharded checkpoint's optimizer state is checked before DCP loads anything, by the rule a
single-file one is (checkpoint.optimizer_state): an index whose optimizer entries disagree with
its own module entries, or a non-tensor value (lr, betas, ...) of another kind than this run's,
is the checkpoint's fault (CorruptCheckpoint: the resume passes it over for the one before it),
never a ConfigError that ends the job nor a value loaded raw that fails the first step of every
attempt; a sound checkpoint of a model the user changed stays a configuration error."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint, resume
from mpjob_trainer.checkpoint.manifest import hash_files
from mpjob_trainer.checkpoint.optimizer_state import value_problem
from mpjob_trainer.checkpoint.shards import INDEX, rank_file, restore_shards
from mpjob_trainer.errors import ConfigError

pytestmark = pytest.mark.unit

NAMES = {"module": "model", "optimizer": "optimizer"}


def objects(seed: int, width: int = 4) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, width), nn.LayerNorm(width))
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=0.1)}


def commit(store: CheckpointStore, step: int, **group: Any) -> Path:
    """A sharded checkpoint of one rank at `step` whose param group holds `group`, committed as
    the trainer commits one (its manifest lists every file's sha256)."""
    written = objects(step)
    model_sd, optim_sd = get_state_dict(written["model"], [written["optimizer"]])
    optim_sd["param_groups"][0].update(group)
    tmp = store.root / f".tmp-{step:09d}-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": step}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    return Path(store.commit(tmp, step, "bf16", files, world_size=1).ref.path)


def resize_in_index(folder: Path, fqn: str, size: tuple[int, ...]) -> None:
    """Make the index say the tensor `fqn` has `size`, its manifest recomputed to match."""
    with (folder / INDEX).open("rb") as f:
        index = pickle.load(f)  # our own, just written
    index.state_dict_metadata[fqn].size = torch.Size(size)
    index.state_dict_metadata[fqn].chunks[0].sizes = torch.Size(size)
    (folder / INDEX).write_bytes(pickle.dumps(index))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = hash_files(folder, [folder / name for name in manifest["files"]])
    (folder / "manifest.json").write_text(json.dumps(manifest))


def resumed(root: Path, run: dict[str, Any]) -> tuple[resume.Loaded | None, list[dict[str, Any]]]:
    """Resume the newest checkpoint under `root` that restores into `run`, and the rejections logged."""
    log: list[dict[str, Any]] = []
    store = CheckpointStore(root, keep=5, config_digest="d1", job="ns/j/u1", log=lambda e, **f: log.append(f))
    loaded = resume.load(store, restore=lambda found: restore_shards(Path(found[1]["shards"]), run, NAMES))
    return loaded, log


def weights_of(run: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in run["model"].state_dict().items()}


def test_an_index_whose_optimizer_state_disagrees_with_its_own_weights_is_passed_over(tmp_path: Path) -> None:
    """The index says exp_avg of 0.weight is (3, 3), its own entry of 0.weight (4, 4): the index's
    fault, not the run's; before, a ConfigError ('the script no longer matches') ended the job."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20)
    resize_in_index(newest, "optimizer.state.0.weight.exp_avg", (3, 3))
    run = objects(0)
    with pytest.raises(CorruptCheckpoint, match=r"'exp_avg' has shape \(3, 3\) where the checkpoint's own weight"):
        restore_shards(newest, run, NAMES)
    loaded, log = resumed(tmp_path, run)
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["problem"] and "disagrees with itself" in log[0]["problem"], log
    assert all(torch.equal(v, weights_of(objects(10))[k]) for k, v in weights_of(run).items())


def test_a_sound_checkpoint_of_a_model_the_user_widened_stays_a_configuration_error(tmp_path: Path) -> None:
    commit(CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1"), 10)
    with pytest.raises(ConfigError, match=r"the script no longer matches"):
        resumed(tmp_path, objects(0, width=8))


#: Settings no AdamW holds, planted in a checkpoint's param group (the single-file tests plant them too).
PLANTED = pytest.mark.parametrize(
    "planted",
    [{"lr": "fast"}, {"lr": [0.1]}, {"betas": (0.9,)}, {"betas": 0.9}, {"amsgrad": "yes"}, {"eps": None}],
    ids=["lr-str", "lr-list", "betas-short", "betas-number", "flag-str", "eps-none"],
)


@PLANTED
def test_a_setting_of_another_kind_is_passed_over_before_anything_loads(
    tmp_path: Path, planted: dict[str, Any]
) -> None:
    """A plain value that reads weights-only and that no AdamW holds: loaded, it failed the first
    step of every attempt (an InfraError, retried) instead of the previous good one being used."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20, **planted)
    run = objects(0)
    before = weights_of(run)
    with pytest.raises(
        CorruptCheckpoint, match=rf"step-000000020: its optimizer\.param_groups\.0\.{next(iter(planted))}"
    ):
        restore_shards(newest, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"
    loaded, log = resumed(tmp_path, run)
    assert loaded is not None and loaded[0].step == 10 and "step-000000020" in log[0]["problem"], log
    assert run["optimizer"].param_groups[0]["lr"] == 0.1 and run["optimizer"].param_groups[0]["betas"] == (0.9, 0.999)


def test_settings_a_run_may_have_changed_still_load(tmp_path: Path) -> None:
    """A whole-number lr, a flag set where this run leaves it None: values of the same kind; the flag,
    how the step runs, stays the run's (checkpoint.optimizer_settings.RUN_FLAGS)."""
    folder = commit(CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1"), 10, lr=1, foreach=False)
    run = objects(0)
    restore_shards(folder, run, NAMES)
    assert run["optimizer"].param_groups[0]["lr"] == 1 and run["optimizer"].param_groups[0]["foreach"] is None
    assert all(torch.equal(v, weights_of(objects(10))[k]) for k, v in weights_of(run).items())


@pytest.mark.parametrize(
    ("live", "read", "problem"),
    [
        (0.1, 1, None),
        (0.1, torch.tensor(0.5), None),
        (torch.tensor(0.1), 0.5, None),
        (None, True, None),
        (False, None, None),
        ((0.9, 0.999), (0.8, 0.99), None),
        (["0.weight"], ["0.weight", "0.bias"], None),
        ({"a": 1.0}, {"a": 2, "b": "x"}, None),
        (0.1, True, "a bool where this run holds a float"),
        (0.1, None, "a NoneType where this run holds a float"),
        (False, "no", "a str where this run holds a bool"),
        (torch.zeros(2), 1.0, "a float where this run holds a Tensor"),
        ((0.9, 0.999), (0.9,), "a tuple (1 items) where this run holds a tuple of 2"),
        (["0.weight"], ["0.weight", 3], "a int where this run holds a str"),
        ({"a": 1.0}, {"a": "x"}, "a str where this run holds a float"),
    ],
)
def test_a_value_read_takes_the_place_of_one_of_its_kind(live: Any, read: Any, problem: str | None) -> None:
    assert value_problem(live, read) == problem


def test_an_index_entry_of_a_negative_size_is_corrupt_when_it_is_verified(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    resize_in_index(commit(store, 20), "model.0.weight", (-1, 4))
    loaded, log = resumed(tmp_path, objects(0))
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["problem"] and "non-negative sizes" in log[0]["problem"], log


class _LowRankAdam(torch.optim.Optimizer):
    """An optimizer of another library's kind (GaLore's): its first moment, under Adam's name, is
    kept in the shape of the gradient projected to rank 1, not in its parameter's shape."""

    def __init__(self, params: Any, lr: float = 0.01) -> None:
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    grad = param.grad.reshape(param.shape[0], -1)
                    moment = self.state[param].setdefault("exp_avg", torch.zeros_like(grad[:1]))
                    moment.mul_(0.9).add_(grad.mean(dim=0, keepdim=True), alpha=0.1)


def low_rank(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 4))
    optimizer = _LowRankAdam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return {"model": model, "optimizer": optimizer}


def test_an_optimizer_not_of_torchs_kinds_is_not_held_to_their_state_shapes(tmp_path: Path) -> None:
    """Its exp_avg of 0.weight is (1, 4) beside the weight's (4, 4): its own way, not a checkpoint
    that disagrees with itself (held to Adam's shapes, every checkpoint of the job was rejected)."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    written = low_rank(10)
    model_sd, optim_sd = get_state_dict(written["model"], [written["optimizer"]])
    tmp = store.root / ".tmp-000000010-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": 10}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    folder = Path(store.commit(tmp, 10, "bf16", files, world_size=1).ref.path)
    run = low_rank(0)
    restore_shards(folder, run, NAMES)
    moment = run["optimizer"].state[run["model"][0].weight]["exp_avg"]
    assert torch.equal(moment, written["optimizer"].state[written["model"][0].weight]["exp_avg"])


def two_groups(seed: int) -> dict[str, Any]:
    """`objects(seed)` with its optimizer regrouped: the weights decayed, the LayerNorm not."""
    run = objects(seed)
    params = list(run["model"].parameters())
    groups = [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0}]
    return {**run, "optimizer": torch.optim.AdamW(groups, lr=0.1)}


def committed(store: CheckpointStore, step: int, run: dict[str, Any], **group: Any) -> Path:
    """`run`'s sharded checkpoint of `step` (its first param group holding `group` besides),
    committed as the trainer commits one."""
    model_sd, optim_sd = get_state_dict(run["model"], [run["optimizer"]])
    optim_sd["param_groups"][0].update(group)
    tmp = store.root / f".tmp-{step:09d}-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": step}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    return Path(store.commit(tmp, step, "bf16", files, world_size=1).ref.path)


@pytest.mark.parametrize(
    ("written", "resumed_with", "shown"),
    [
        (
            two_groups,
            objects,
            r"as 0.weight, 0.bias \| 1.weight, 1.bias and this run's optimizer as 0.weight, 0.bias, 1",
        ),
        (
            objects,
            two_groups,
            r"as 0.weight, 0.bias, 1.weight, 1.bias and this run's optimizer as 0.weight, 0.bias \| 1",
        ),
    ],
    ids=["two-into-one", "one-into-two"],
)
def test_an_optimizer_the_user_regrouped_is_a_configuration_error_before_anything_loads(
    tmp_path: Path, written: Any, resumed_with: Any, shown: str
) -> None:
    """Two groups written, one resumed: before, DCP read group 0 alone and torch took its settings
    (weight decay 0.01) for every parameter, the LayerNorm's included, where a single file is
    refused (torch: 'a different number of parameter groups')."""
    folder = committed(CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1"), 10, written(10))
    run = resumed_with(0)
    before = weights_of(run)
    with pytest.raises(
        ConfigError, match=rf"step-000000010 into this run's optimizer: it groups its parameters {shown}"
    ):
        restore_shards(folder, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        (["0.weight", "0.bias", "1.weight", "elsewhere"], r"lists 'elsewhere' in a parameter group, no weight of its"),
        (["0.weight", "0.bias", "1.weight", "0.weight"], r"lists '0.weight' twice"),
        (["0.weight", "0.bias", "1.weight", 3], r"lists no names in parameter group 0 \(a list\)"),
        ([], r"holds optimizer state of '0.bias', listed in no parameter group"),
        (["0.weight", "0.bias"], r"holds optimizer state of '1.bias', listed in no parameter group"),
    ],
    ids=["a-name-not-its-own", "a-name-twice", "a-number", "empty", "short"],
)
def test_a_group_whose_names_disagree_with_the_index_is_passed_over(
    tmp_path: Path, params: list[Any], problem: str
) -> None:
    """The index's fault: the one before it is used. Before, each loaded, and a group left without
    the name of one of this run's parameters came without lr or betas: the first step of every
    attempt failed (KeyError 'betas', taken for an infrastructure failure)."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20, params=params)
    run = objects(0)
    with pytest.raises(CorruptCheckpoint, match=rf"step-000000020: its index's 'optimizer' {problem}"):
        restore_shards(newest, run, NAMES)
    assert run["optimizer"].param_groups[0]["lr"] == 0.1
    loaded, log = resumed(tmp_path, run)
    assert loaded is not None and loaded[0].step == 10 and "step-000000020" in log[0]["problem"], log
    assert all(torch.equal(v, weights_of(objects(10))[k]) for k, v in weights_of(run).items())


@pytest.mark.parametrize("planted", [{"lr": float("nan")}, {"betas": (0.9, 1.5)}], ids=["lr-nan", "beta-above-one"])
def test_a_setting_of_no_value_an_optimizer_runs_with_is_passed_over(tmp_path: Path, planted: dict[str, Any]) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")
    commit(store, 10)
    newest = commit(store, 20, **planted)
    run = objects(0)
    with pytest.raises(
        CorruptCheckpoint, match=rf"step-000000020: its optimizer\.param_groups\.0\.{next(iter(planted))}"
    ):
        restore_shards(newest, run, NAMES)
    assert (loaded := resumed(tmp_path, run)[0]) is not None and loaded[0].step == 10
