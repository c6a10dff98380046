"""A checkpoint's tensor is loaded only in the dtype it was written in (checkpoint.dtypes): before,
torch's copy_ cast whatever was read (fp16, int64, bool; a complex value lost its imaginary part)
into the run's tensor, in both formats. A shard's tensor of another dtype than its own index says
is the checkpoint's fault (passed over for the one before it); a checkpoint that says another dtype
than this run's tensor is the run's setup (the model built in another dtype): a ConfigError naming
the tensor and both dtypes, before anything loads."""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.manifest import PartlyLoaded
from mpjob_trainer.checkpoint.shards import INDEX, restore_shards
from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.test_hostile_dcp_files import _recompute_manifest
from tests.unit.trainer.test_optimizer_run_flags import stepped_state
from tests.unit.trainer.test_sharded_load_faults import built, commit, weights_of
from tests.unit.trainer.test_sharded_optimizer_faults import NAMES, resumed

pytestmark = pytest.mark.unit

WEIGHT = "model.0.linear.weight"
#: What a weight of float32 may be read as, and what copy_ made of it.
OTHER = [torch.float16, torch.int64, torch.bool, torch.complex64]


def store_of(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path, keep=5, config_digest="d1", job="ns/j/u1")


def shard_holds(folder: Path, fqn: str, value: torch.Tensor) -> None:
    """Make the shard file hold `value` as the tensor `fqn` (its index left as written), pickled at
    the file's end, the manifest recomputed to match."""
    with (folder / INDEX).open("rb") as f:
        index = pickle.load(f)  # our own, just written
    shard, pickled = folder / "__0_0.distcp", io.BytesIO()
    raw = shard.read_bytes()
    torch.save(value, pickled)
    shard.write_bytes(raw + pickled.getvalue())
    info = next(info for key, info in index.storage_data.items() if key.fqn == fqn)
    info.offset, info.length = len(raw), len(pickled.getvalue())
    (folder / INDEX).write_bytes(pickle.dumps(index))
    _recompute_manifest(folder)


@pytest.mark.parametrize("dtype", OTHER, ids=str)
def test_a_shard_of_another_dtype_than_its_index_is_passed_over(tmp_path: Path, dtype: torch.dtype) -> None:
    store = store_of(tmp_path)
    commit(store, 10)
    newest = commit(store, 20)
    shard_holds(
        newest, WEIGHT, (torch.ones(4, 4) * (1 + 1j)).to(dtype) if dtype.is_complex else torch.ones(4, 4).to(dtype)
    )
    with pytest.raises(PartlyLoaded, match=rf"{WEIGHT}: its shard holds {dtype} where its index says torch.float32"):
        restore_shards(newest, built(0), NAMES)
    run = built(0)
    loaded, log = resumed(tmp_path, run)
    assert loaded is not None and loaded[0].step == 10 and str(dtype) in log[0]["problem"], log
    assert torch.equal(weights_of(run)["0.linear.weight"], weights_of(built(10))["0.linear.weight"])


@pytest.mark.parametrize("dtype", OTHER, ids=str)
def test_a_sharded_checkpoint_of_another_dtype_than_the_runs_is_a_configuration_error(
    tmp_path: Path, dtype: torch.dtype
) -> None:
    def cast(state: dict[str, Any]) -> None:
        state["model"]["0.linear.weight"] = state["model"]["0.linear.weight"].to(dtype)

    folder = commit(store_of(tmp_path), 20, cast)
    run = built(0)
    before = weights_of(run)
    said = rf"step-000000020: its {WEIGHT} is {dtype} where this run's is torch.float32: the script builds it"
    with pytest.raises(ConfigError, match=said):
        restore_shards(folder, run, NAMES)
    assert all(torch.equal(v, before[k]) for k, v in weights_of(run).items()), "nothing loaded"


@pytest.mark.parametrize("dtype", OTHER, ids=str)
@pytest.mark.parametrize(
    ("where", "named"), [("weight", r"model.0.weight"), ("moment", r"'optimizer' state 'exp_avg'")], ids=str
)
def test_a_single_files_tensor_of_another_dtype_than_the_runs_is_a_configuration_error(
    tmp_path: Path, dtype: torch.dtype, where: str, named: str
) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    state = stepped_state(5).capture(5, 5, "fp32", None)
    if where == "weight":
        state["model"]["0.weight"] = state["model"]["0.weight"].to(dtype)
    else:
        state["optimizer"]["state"][0]["exp_avg"] = state["optimizer"]["state"][0]["exp_avg"].to(dtype)
    _, read = store.verify(Path(store.write(5, "fp32", state).ref.path))
    run = stepped_state(0)
    before = [p.detach().clone() for p in run.parameters()]
    with pytest.raises(ConfigError, match=rf"step 5: its {named} is {dtype} where this run's is torch.float32"):
        run.restore(read, "fp32", None)
    assert all(torch.equal(p, b) for p, b in zip(run.parameters(), before, strict=True)), "nothing loaded"
