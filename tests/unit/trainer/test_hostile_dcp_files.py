"""A sharded checkpoint's DCP files are read without running code from them: a planted index
(`.metadata`) or a planted non-tensor value, with the manifest recomputed to match, runs nothing;
the index is checked when the checkpoint is verified, so the previous good one is used. A value
a rank reads from a bucket by range, and the rank file it loads, are ones it checked itself."""

from __future__ import annotations

import copy
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict

from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint, resume
from mpjob_trainer.checkpoint.dcp_files import MAX_INDEX_BYTES, index_size_problem
from mpjob_trainer.checkpoint.manifest import DCP, Manifest, hash_files
from mpjob_trainer.checkpoint.shards import INDEX, listing_problem, rank_file, restore_shards
from tests.unit.trainer.test_sharding import ranks

pytestmark = pytest.mark.unit

NAMES = {"module": "model", "optimizer": "optimizer"}


class Plant:
    """Unpickled, it makes the folder `marker`: proof that code from the checkpoint ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def _objects(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    return {"model": model, "optimizer": torch.optim.AdamW(model.parameters(), lr=0.1)}


def _commit(store: CheckpointStore, step: int, lr: Any = 0.1) -> Path:
    """A sharded checkpoint of one rank at `step`, committed as the trainer commits one."""
    objects = _objects(step)
    model_sd, optim_sd = get_state_dict(objects["model"], [objects["optimizer"]])
    optim_sd["param_groups"][0]["lr"] = lr
    tmp = store.root / f".tmp-{step:09d}-0"
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    torch.save({"step": step}, tmp / rank_file(0))
    files = hash_files(tmp, [p for p in tmp.rglob("*") if p.is_file()])
    return Path(store.commit(tmp, step, "bf16", files, world_size=1).ref.path)


def _recompute_manifest(folder: Path) -> None:
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = hash_files(folder, [folder / name for name in manifest["files"]])
    path.write_text(json.dumps(manifest))


def _store(root: Path, log: list[dict[str, Any]]) -> CheckpointStore:
    return CheckpointStore(root, keep=5, config_digest="d1", job="ns/j/u1", log=lambda e, **f: log.append(f))


def _plant_index(folder: Path, marker: Path) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(Plant(marker)))
    _recompute_manifest(folder)


def test_a_planted_index_runs_nothing_and_the_previous_good_checkpoint_is_used(tmp_path: Path) -> None:
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    marker = tmp_path / "ran"
    _plant_index(newest, marker)
    loaded = resume.load(_store(tmp_path / "ckpt", log), prefer=str(newest))
    assert not marker.exists()
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["problem"] and "not DCP's metadata" in log[0]["problem"]
    with pytest.raises(CorruptCheckpoint):  # and a restore told to read it anyway runs nothing either
        restore_shards(newest, _objects(0), NAMES)
    assert not marker.exists()


def test_a_planted_value_in_the_shards_runs_nothing_and_the_previous_good_checkpoint_is_used(tmp_path: Path) -> None:
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    marker = tmp_path / "ran"
    newest = _commit(store, 20, lr=Plant(marker))
    shutil.rmtree(marker, ignore_errors=True)  # saving it did not run it; be sure
    loaded = resume.load(_store(tmp_path / "ckpt", log), prefer=str(newest))
    assert not marker.exists()
    assert loaded is not None and loaded[0].step == 10 and "not a plain value" in log[0]["problem"]
    with pytest.raises(CorruptCheckpoint, match="not a plain value"):  # and a restore runs nothing either
        restore_shards(newest, _objects(0), NAMES)
    assert not marker.exists()


def test_a_good_sharded_checkpoint_restores_every_value(tmp_path: Path) -> None:
    store = _store(tmp_path / "ckpt", [])
    folder = _commit(store, 10, lr=0.25)
    objects = _objects(0)
    restore_shards(folder, objects, NAMES)
    expected = _objects(10)["model"].state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in objects["model"].state_dict().items())
    assert objects["optimizer"].param_groups[0]["lr"] == 0.25


def zero_a_tensor(folder: Path) -> None:
    """Zero the bytes of one tensor in the shards (its non-tensor values stay readable)."""
    with (folder / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # our own, just written
    tensors = [k for k, v in metadata.state_dict_metadata.items() if type(v).__name__ == "TensorStorageMetadata"]
    info = next(v for i, v in metadata.storage_data.items() if i.fqn == tensors[0])
    shard = bytearray((folder / info.relative_path).read_bytes())
    shard[info.offset : info.offset + info.length] = b"\0" * info.length
    (folder / info.relative_path).write_bytes(bytes(shard))
    _recompute_manifest(folder)


def test_a_shard_that_verifies_but_does_not_load_falls_back_to_the_previous_good_checkpoint(tmp_path: Path) -> None:
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    zero_a_tensor(newest)  # damaged, with a manifest recomputed to match
    objects = _objects(0)
    reader = _store(tmp_path / "ckpt", log)
    loaded = resume.load(reader, restore=lambda got: restore_shards(Path(got[1]["shards"]), objects, NAMES))
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["problem"] and "cannot read its shards" in log[0]["problem"]
    expected = _objects(10)["model"].state_dict()  # the previous good one's values, all of them
    assert all(torch.equal(v, expected[k]) for k, v in objects["model"].state_dict().items())
    _commit(reader, 20)  # a save of its step replaces it rather than keeping it
    assert list((tmp_path / "ckpt").glob(".corrupt-step-000000020-*"))
    restore_shards(newest, _objects(0), NAMES)


def _unlist(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest["files"].pop(name)


def _world_size(size: int) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest.update(worldSize=size)


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (_unlist(rank_file(0)), "does not list rank-00000.pt"),
        (_unlist(".metadata"), "does not list DCP's index"),
        (_world_size(2), "does not list rank-00001.pt"),
    ],
    ids=["rank-file", "index", "world-size"],
)
def test_a_sharded_manifest_that_leaves_out_a_file_every_restore_reads_is_corrupt(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], problem: str
) -> None:
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    manifest = json.loads((newest / "manifest.json").read_text())
    edit(manifest)
    for rank in (0, 1):  # a rank file the manifest does not list, planted: it would be read unchecked
        if rank_file(rank) not in manifest["files"]:
            torch.save({"step": 20, "planted": True}, newest / rank_file(rank))
    (newest / "manifest.json").write_text(json.dumps(manifest))
    loaded = resume.load(_store(tmp_path / "ckpt", log))
    assert loaded is not None and loaded[0].step == 10 and "planted" not in loaded[1]
    assert "step-000000020" in log[0]["problem"] and problem in log[0]["problem"], log


def test_an_index_larger_than_a_restore_reads_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """Before, DCP's index was read whole into memory at whatever size the manifest listed (up to
    16 TiB), then unpickled: a planted one of MAX_INDEX_BYTES + 1, hashed into the manifest (DCP's
    index followed by zeros, which the unpickler never reaches), was taken. Now it is a listing
    problem, the previous good checkpoint is used, and a restore told to read it reads none of it."""
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    with (newest / INDEX).open("r+b") as f:
        f.truncate(MAX_INDEX_BYTES + 1)  # sparse: no disk, and no memory unless read
    _recompute_manifest(newest)
    loaded = resume.load(_store(tmp_path / "ckpt", log), prefer=str(newest))
    assert loaded is not None and loaded[0].step == 10
    said = f"{INDEX} of {MAX_INDEX_BYTES + 1} bytes, over the {MAX_INDEX_BYTES} bytes"
    assert "step-000000020" in log[0]["problem"] and said in log[0]["problem"], log
    with pytest.raises(CorruptCheckpoint, match=said):
        restore_shards(newest, _objects(0), NAMES)


def test_an_index_is_read_up_to_its_limit_and_a_save_writes_none_larger() -> None:
    """The one rule the manifest's listing, the reader and a save's check apply alike."""
    assert index_size_problem(MAX_INDEX_BYTES) is None and MAX_INDEX_BYTES <= 1 << 30
    assert index_size_problem(MAX_INDEX_BYTES + 1) == (
        f"DCP's index {INDEX} of {MAX_INDEX_BYTES + 1} bytes, over the {MAX_INDEX_BYTES} bytes a restore reads of one"
    )


def test_a_planted_world_size_of_millions_is_refused_as_quickly_as_a_true_one() -> None:
    """A restore looks at up to 32 candidates: a manifest claiming 4 million ranks must not make
    it build a name for each of them (seconds of CPU and hundreds of MiB a candidate)."""
    files = {name: {"sha256": "0" * 64, "bytes": 1} for name in (INDEX, rank_file(0))}
    planted = Manifest(20, "bf16", None, format_version=3, files=files, layout=DCP, world_size=2**22)
    started = time.process_time()
    problem = listing_problem(planted)
    assert time.process_time() - started < 0.5
    assert problem == f"does not list {rank_file(1)}, the rank file of one of its {2**22} ranks"


@pytest.mark.process
def test_a_rank_file_another_rank_checked_is_not_loaded_unchecked(tmp_path: Path) -> None:
    """Resumed on more processes than wrote it, rank 1 loads rank-00000.pt, in rank 0's share
    of the checks: a copy unlike the one rank 0 checked makes the checkpoint corrupt on both."""
    seen = ranks(tmp_path, "rank_file_checked_elsewhere", 2)
    assert all("rank-00000.pt sha256 mismatch" in rank.get("problem", "") for rank in seen), seen


@pytest.mark.process
def test_a_value_read_by_range_is_checked_by_the_rank_reading_it(tmp_path: Path) -> None:
    """Rank 1 reads the lr in __0_0.distcp (rank 0's share) by a ranged read, after the object
    changed in the bucket: it refuses the bytes; unchanged, it reads the lr written."""
    (tmp_path / "changed").mkdir()
    changed = ranks(tmp_path / "changed", "ranged_value_changed", 2)
    assert "not what" in changed[1].get("problem", ""), changed
    (tmp_path / "unchanged").mkdir()
    unchanged = ranks(tmp_path / "unchanged", "ranged_value_unchanged", 2)
    assert [rank["value"] for rank in unchanged] == [0.1, 0.1]


def _zero_the_last_tensor(folder: Path) -> None:
    """Zero the bytes of the tensor read last from its shard file (those before it load)."""
    with (folder / ".metadata").open("rb") as f:
        metadata = pickle.load(f)  # our own, just written
    tensors = {k for k, v in metadata.state_dict_metadata.items() if type(v).__name__ == "TensorStorageMetadata"}
    info = max((v for i, v in metadata.storage_data.items() if i.fqn in tensors), key=lambda v: v.offset)
    shard = bytearray((folder / info.relative_path).read_bytes())
    shard[info.offset : info.offset + info.length] = b"\0" * info.length
    (folder / info.relative_path).write_bytes(bytes(shard))
    _recompute_manifest(folder)


def test_shards_that_fail_to_load_after_part_of_them_was_read_never_make_a_fresh_start(tmp_path: Path) -> None:
    """The only checkpoint's shards verify and fail to load once some of them are in the weights: the
    run must not start at step 0 from those half-loaded weights; the attempt ends, naming it."""
    log: list[dict[str, Any]] = []
    only = _commit(_store(tmp_path / "ckpt", log), 20)
    _zero_the_last_tensor(only)
    objects = _objects(0)
    initial = {k: v.clone() for k, v in objects["model"].state_dict().items()}
    with pytest.raises(resume.ResumedApart) as ended:
        resume.load(_store(tmp_path / "ckpt", log), restore=lambda got: restore_shards(only, objects, NAMES))
    assert "step-000000020" in str(ended.value) and "in part" in str(ended.value), ended.value
    assert "cannot read its shards" in log[0]["problem"]
    changed = [k for k, v in objects["model"].state_dict().items() if not torch.equal(v, initial[k])]
    assert changed, "the load had begun: no longer the initial weights (why a fresh start is refused)"


def test_a_manifest_replaced_after_verification_lets_the_index_name_no_unchecked_file(tmp_path: Path) -> None:
    """Between a sharded checkpoint's verification and the read of its shards, its manifest is
    replaced by one listing a planted shard file, and its index by one pointing there: the restore
    reads the index and the shards as they were verified, so the planted weights are never loaded."""
    from mpjob_trainer.session.state import TrainingState, rng_state

    store = _store(tmp_path / "ckpt", [])
    folder = _commit(store, 20)
    torch.save({"step": 20, "rng": rng_state(), "shardedObjects": NAMES}, folder / rank_file(0))
    _recompute_manifest(folder)
    planted = _commit(_store(tmp_path / "other", []), 30)  # the same shapes, other values
    _, state = store.verify(folder)
    shutil.copy(planted / "__0_0.distcp", folder / "__9_0.distcp")
    with (planted / INDEX).open("rb") as f:
        index = pickle.load(f)  # our own, just written
    for info in index.storage_data.values():
        info.relative_path = "__9_0.distcp"
    (folder / INDEX).write_bytes(pickle.dumps(index))
    _recompute_manifest(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"].update(hash_files(folder, [folder / "__9_0.distcp"]))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    objects = _objects(0)
    TrainingState(objects).restore(state, "fp32", None)
    written = _objects(20)["model"].state_dict()  # the verified checkpoint's values, none of the planted file's
    assert all(torch.equal(v, written[k]) for k, v in objects["model"].state_dict().items())


def _path_outside(metadata: Any) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = "../step-000000010/__0_0.distcp"


def _key_a_string(metadata: Any) -> None:
    metadata.storage_data = {str(index.fqn): info for index, info in metadata.storage_data.items()}


def _path_a_list(metadata: Any) -> None:
    for info in metadata.storage_data.values():
        info.relative_path = [info.relative_path]


def _no_size(metadata: Any) -> None:
    entry = next(e for e in metadata.state_dict_metadata.values() if hasattr(e, "size"))
    del entry.size


def _name_a_number(metadata: Any) -> None:
    metadata.state_dict_metadata = dict(enumerate(metadata.state_dict_metadata.values()))


def _storage_meta_a_size(metadata: Any) -> None:
    metadata.storage_meta = torch.Size([1])  # DCP's reader sets its load_id, inside the load


def _weight(metadata: Any) -> Any:
    return metadata.state_dict_metadata["model.0.weight"]


def _no_chunks(metadata: Any) -> None:
    _weight(metadata).chunks = []  # DCP plans no read of it: the run's own values stay, unloaded


def _half_a_chunk(metadata: Any) -> None:
    (chunk,) = _weight(metadata).chunks
    chunk.sizes = torch.Size([chunk.sizes[0] // 2, *chunk.sizes[1:]])


def _chunk_twice(metadata: Any) -> None:
    (chunk,) = _weight(metadata).chunks
    rows = chunk.sizes[0] // 2
    _weight(metadata).chunks = [copy.copy(chunk), chunk]
    _weight(metadata).chunks[0].sizes = torch.Size([rows, *chunk.sizes[1:]])
    chunk.offsets = torch.Size([rows - 1, *chunk.offsets[1:]])  # one row read twice, the last left out
    chunk.sizes = torch.Size([rows, *chunk.sizes[1:]])


@pytest.mark.parametrize(
    ("malform", "said"),
    [
        (_path_outside, "not a file of the checkpoint"),
        (_key_a_string, "not a value's index"),
        (_path_a_list, "not a file of the checkpoint"),
        (_no_size, "neither a value nor a tensor"),
        (_name_a_number, "not named by strings"),
        (_no_chunks, "do not cover the tensor exactly once"),
        (_half_a_chunk, "do not cover the tensor exactly once"),
        (_chunk_twice, "do not cover the tensor exactly once"),
        (_storage_meta_a_size, "storage_meta is not DCP's"),
    ],
    ids=[
        "path-outside", "key-a-string", "path-a-list", "tensor-without-size", "name-a-number",
        "tensor-without-chunks", "tensor-half-covered", "a-row-twice-a-row-never", "storage-meta-a-size",
    ],
)  # fmt: skip
def test_an_index_naming_files_outside_or_of_the_wrong_shapes_is_corrupt_not_a_crash(
    tmp_path: Path, malform: Callable[[Any], None], said: str
) -> None:
    """An index naming a file outside the checkpoint is its fault. Only DCP's classes unpickle,
    but their fields may hold anything: the checks read them as
    DCP writes them and raised AttributeError or TypeError, which no rank took for the
    checkpoint's fault: every retry stopped on it instead of using the one before."""
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    index = newest / ".metadata"
    with index.open("rb") as f:
        metadata = pickle.load(f)  # our own, just written
    malform(metadata)
    index.write_bytes(pickle.dumps(metadata))
    _recompute_manifest(newest)
    loaded = resume.load(_store(tmp_path / "ckpt", log), prefer=str(newest))
    assert loaded is not None and loaded[0].step == 10 and said in log[0]["problem"], log


def test_a_listed_file_of_a_long_name_is_read_as_any_other_and_the_checkpoint_judged_on_it(tmp_path: Path) -> None:
    """A manifest may name a file of up to 1024 characters (checkpoint.document), far past what a
    memfd's name may hold (249 bytes): the copy it is checked into raised OSError (EINVAL), a
    failure with no verdict that ended the resume on every rank instead of using the one before."""
    log: list[dict[str, Any]] = []
    store = _store(tmp_path / "ckpt", log)
    _commit(store, 10)
    newest = _commit(store, 20)
    name = f"{'x' * 250}/{'y' * 250}"
    (newest / name).parent.mkdir()
    (newest / name).write_bytes(b"not a file DCP wrote")
    path = newest / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"] = {**manifest["files"], name: {"sha256": "0" * 64, "bytes": len(b"not a file DCP wrote")}}
    path.write_text(json.dumps(manifest))
    loaded = resume.load(_store(tmp_path / "ckpt", log), prefer=str(newest))
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["problem"] and "sha256 mismatch" in log[0]["problem"], log
