"""A sharded checkpoint in a bucket is read as one on a volume: each object a rank reads whole is
streamed into the copy it hashes (checkpoint.bucket_files, checkpoint.checked), so an object
changed in the bucket after its check is never loaded, one longer than its manifest says is not
read past its size, and the tensors of a rank's own share are hashed once (checkpoint.shard_copies)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import CorruptCheckpoint, checked, manifest
from mpjob_trainer.checkpoint.bucket_files import BucketFiles, fetch_files
from mpjob_trainer.checkpoint.checked import VolumeFiles
from mpjob_trainer.checkpoint.dcp_reader import item_spans, value_spans
from mpjob_trainer.checkpoint.manifest import read_manifest
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.shard_copies import CheckedShards
from mpjob_trainer.checkpoint.shards import LISTED, restore_shards
from tests.unit.trainer.memory_bucket import PART, SETTINGS, MemoryBucket
from tests.unit.trainer.test_checked_shards import NAMES, commit, objects_of, store_at

pytestmark = pytest.mark.unit

SHARD = "__0_0.distcp"


def _in_bucket(tmp_path: Path, step: int) -> tuple[MemoryBucket, BucketCheckpointStore]:
    """A bucket store holding the sharded checkpoint of one rank at `step` (written on a volume)."""
    bucket = MemoryBucket()
    store = BucketCheckpointStore(
        f"{SETTINGS.url}/ns/j/u1", SETTINGS, keep=5, config_digest="d1", job="ns/j/u1", bucket=bucket
    )
    folder = commit(store_at(tmp_path / "written"), step)
    for path in folder.iterdir():
        bucket.put(f"{store.key}/{folder.name}/{path.name}", path.read_bytes())
    return bucket, store


def test_a_shard_object_changed_right_after_its_check_is_never_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shard object replaced in the bucket by another checkpoint's (same shapes) once its
    streamed copy was hashed: the restore loads the values checked, never the planted ones."""
    bucket, store = _in_bucket(tmp_path, 20)
    key = f"{store.key}/step-000000020/{SHARD}"
    planted = (commit(store_at(tmp_path / "other"), 30) / SHARD).read_bytes()
    assert planted != bucket.objects[key] and len(planted) == len(bucket.objects[key])
    compare, seen = manifest.same_sha256, []

    def then_swap(folder: Path, name: str, actual: str, meta: dict[str, Any]) -> None:
        compare(folder, name, actual, meta)
        seen.append(name)
        if name == SHARD:
            bucket.objects[key] = planted

    monkeypatch.setattr(checked, "same_sha256", then_swap)
    _, state = store.verify(store.url(20))
    objects = objects_of(0)
    restore_shards(Path(state["shards"]), objects, NAMES, state[LISTED])
    assert SHARD in seen and bucket.objects[key] == planted  # the swap happened
    written = objects_of(20)["model"].state_dict()
    assert all(torch.equal(v, written[k]) for k, v in objects["model"].state_dict().items())
    assert not any(store.root.rglob(SHARD))  # streamed into its checked copy: never on the spool's disk


def test_a_shard_object_longer_than_its_manifest_says_is_refused_at_its_size(tmp_path: Path) -> None:
    """An object grown past its size since the listing: the copy stops one write past it."""
    bucket, store = _in_bucket(tmp_path, 20)
    key = f"{store.key}/step-000000020/{SHARD}"
    size = len(bucket.objects[key])
    bucket.objects[key] += b"\0" * (8 << 20)
    source = BucketFiles(bucket, f"{store.key}/step-000000020", tmp_path / "step-000000020")
    got: list[int] = []
    with pytest.raises(CorruptCheckpoint, match=f"{SHARD} is longer in the bucket than its manifest says"):
        source.copy(SHARD, {"bytes": size, "sha256": "0" * 64}, lambda chunk: got.append(len(chunk)))
    assert sum(got) <= size


def test_on_the_world_size_that_wrote_it_a_share_hashes_its_values_alone(tmp_path: Path) -> None:
    """Another rank reads only the non-tensor values of this rank's files by range on the same
    world size: their sha256 alone is taken beside the whole-file hash; resharded, every item's."""
    folder = commit(store_at(tmp_path / "ckpt"), 20, width=64)
    files = read_manifest(folder).files
    same, resharded = CheckedShards(VolumeFiles(folder), files), CheckedShards(VolumeFiles(folder), files)
    index = same.index()
    assert set(same.check_share(list(files), resharded=False)) == set(value_spans(index, {SHARD}))
    assert set(resharded.check_share(list(files), resharded=True)) == set(item_spans(index, {SHARD}))
    assert len(item_spans(index, {SHARD})) > len(value_spans(index, {SHARD})) > 0


def test_a_tensor_read_without_a_ranged_sha256_comes_from_a_checked_copy(tmp_path: Path) -> None:
    """A tensor of a file this rank does not hold, with no sha256 from the rank that checked it:
    the whole file is copied and hashed, so damaged bytes are refused, never loaded."""
    folder = commit(store_at(tmp_path / "ckpt"), 20, width=64)
    files = read_manifest(folder).files
    shards = CheckedShards(VolumeFiles(folder), files)
    shards.values = shards.check_share(list(files), resharded=False)
    shards.drop(SHARD)
    tensor = next(span for span in item_spans(shards.index(), {SHARD}) if span not in shards.values)
    with (folder / SHARD).open("r+b") as f:
        f.seek(tensor[1] + tensor[2] - 1)
        f.write(bytes([f.read(1)[0] ^ 0xFF]))
    with pytest.raises(CorruptCheckpoint, match=f"{SHARD} sha256 mismatch"):
        shards.read(*tensor)
    shards.close()


def test_a_single_file_object_grown_after_its_listing_is_not_downloaded_past_its_manifests_size(
    tmp_path: Path,
) -> None:
    """A single-file checkpoint's objects are downloaded after their sizes were checked from the
    listing: one replaced in between by a larger object was written to the disk whole (any size)
    before its size was checked again."""
    bucket = MemoryBucket()
    bucket.put("ckpt/step-000000010/state.pt", b"x" * 10)
    listed = manifest.Manifest(10, "fp32", "d", 2, {"state.pt": {"sha256": "0" * 64, "bytes": 10}})
    bucket.put("ckpt/step-000000010/state.pt", b"x" * 10 * PART)  # replaced after the listing
    folder = tmp_path / "step-000000010"
    folder.mkdir()
    with pytest.raises(CorruptCheckpoint, match=r"state\.pt is longer in the bucket than its manifest says"):
        fetch_files(bucket, "ckpt/step-000000010", folder, listed)
    assert (folder / "state.pt").stat().st_size <= PART  # stopped at the first part past its size
