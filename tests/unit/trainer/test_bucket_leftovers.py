"""What a bucket save that never commits leaves, and when it goes (checkpoint.leftovers).

A save whose manifest put fails deletes the files it uploaded, unless the bucket says the
manifest landed all the same (an answer lost after the server stored it: the checkpoint is
committed, and deleting what it names would leave it naming nothing). A save killed midway leaves
a step folder with no manifest, which a later save's prune clears once it is below the step saved
and untouched for a day. The bucket runs in memory with the store's own Bucket surface
(memory_bucket); its manifest puts fail as told, its objects are dated as a test says."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.leftovers import QUIET
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name
from mpjob_trainer.checkpoint.objects import new_writer
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"
PREFIX = "runs/ns/job/uid"
LOST = "Connection was closed before we received a valid response from endpoint URL"


class FailingCommits(MemoryBucket):
    """A bucket whose manifest puts fail once `failing`: stored first when `landed` (the answer
    lost on its way back), or not; with `gone`, every read after that put fails too."""

    def __init__(self) -> None:
        super().__init__()
        self.failing = self.landed = self.gone = self.unreadable = False

    def put(self, key: str, body: bytes) -> None:
        if self.failing and key.endswith(f"/{MANIFEST}"):
            if self.landed:
                super().put(key, body)
            self.unreadable = self.gone
            raise ConnectionError(f"{LOST}: put {key}")
        super().put(key, body)

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        if self.unreadable:
            raise ConnectionError(f"{LOST}: get {key}")
        return super().get(key, max_bytes)


def _state(step: int) -> dict[str, Any]:
    return {"step": step, "model": {"w": torch.full((4,), float(step))}}


def _store(bucket: MemoryBucket, log: list[dict[str, Any]] | None = None) -> BucketCheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    location = f"{SETTINGS.url}/{JOB}"
    return BucketCheckpointStore(location, SETTINGS, keep=5, config_digest="d1", job=JOB, bucket=bucket, log=record)


def _below(bucket: MemoryBucket, step: int) -> list[str]:
    return sorted(key for key in bucket.objects if key.startswith(f"{PREFIX}/{folder_name(step)}/"))


def test_a_save_whose_manifest_put_never_landed_deletes_what_it_uploaded() -> None:
    bucket = FailingCommits()
    store = _store(bucket)
    store.write(10, "fp32", _state(10))
    bucket.failing = True
    with pytest.raises(ConnectionError):
        store.write(20, "fp32", _state(20))
    assert _below(bucket, 20) == []
    assert _below(bucket, 10) != []


def test_a_sharded_commit_whose_manifest_put_never_landed_deletes_every_ranks_files(tmp_path: Path) -> None:
    bucket = FailingCommits()
    store, writer = _store(bucket), new_writer()
    files = {}
    for rank in range(2):
        (tmp_path / f"rank-{rank}.pt").write_bytes(b"shard %d" % rank)
        files[f"rank-{rank}.pt"] = {"sha256": "0" * 64, "bytes": 7}
        store.publish(20, tmp_path, {f"rank-{rank}.pt": files[f"rank-{rank}.pt"]}, writer=writer)
    assert len(_below(bucket, 20)) == 2
    bucket.failing = True
    with pytest.raises(ConnectionError):
        store.commit(tmp_path, 20, "fp32", files, world_size=2, writer=writer)
    assert _below(bucket, 20) == []


def test_a_manifest_put_that_landed_despite_its_error_keeps_the_checkpoint_whole() -> None:
    bucket = FailingCommits()
    store = _store(bucket)
    store.write(10, "fp32", _state(10))
    bucket.failing = bucket.landed = True
    with pytest.raises(ConnectionError):
        store.write(20, "fp32", _state(20))
    assert f"{PREFIX}/{folder_name(20)}/{MANIFEST}" in _below(bucket, 20)
    loaded = resume.load(store, None, restore=lambda loaded: None)
    assert loaded is not None and loaded[0].step == 20  # committed, whole: the files it names stayed


def test_when_the_bucket_cannot_say_whether_the_manifest_landed_the_files_stay_and_it_is_said() -> None:
    bucket = FailingCommits()
    log: list[dict[str, Any]] = []
    store = _store(bucket, log)
    bucket.failing = bucket.gone = True
    with pytest.raises(ConnectionError, match="put"):
        store.write(20, "fp32", _state(20))
    assert [key.rsplit("/", 1)[-1] for key in _below(bucket, 20)] == ["state.pt"]
    (left,) = [line for line in log if line["event"] == "checkpointUploadsLeft"]
    assert left["prefix"].startswith(f"{PREFIX}/{folder_name(20)}/w-") and "get" in left["problem"]
    json.dumps(left)


# -- what a save killed midway left ---------------------------------------------------------------
# A step folder with no manifest, below the step a save just committed and untouched for longer
# than any save's upload stands still (leftovers.QUIET), is what a save that never committed left:
# the prune after that save clears it. Nothing else goes.

LONG_AGO = datetime.now(UTC) - QUIET - timedelta(hours=1)


def _plant(bucket: MemoryBucket, prefix: str, *names: str, when: datetime = LONG_AGO) -> list[str]:
    """Objects a killed save left (`names` below `prefix`), last written `when`."""
    keys = [f"{prefix}/{name}" for name in names]
    for key in keys:
        bucket.objects[key], bucket.written[key] = b"left by a killed save", when
    return keys


def test_a_killed_saves_folder_below_the_step_saved_is_cleared_by_its_prune() -> None:
    bucket = MemoryBucket()
    store = _store(bucket)
    store.write(10, "fp32", _state(10))
    _plant(bucket, f"{PREFIX}/{folder_name(20)}", "w-0123456789ab/__0_0.distcp", "w-0123456789ab/__1_0.distcp")
    _plant(bucket, f"{PREFIX}/{folder_name(20)}", "w-ba9876543210/state.pt", "state.pt")  # an older trainer's too
    assert store.write(30, "fp32", _state(30)).housekeeping is None
    assert _below(bucket, 20) == []
    assert [step for step, _ in store.steps()] == [10, 30]
    loaded = resume.load(store, None, restore=lambda loaded: None)
    assert loaded is not None and loaded[0].step == 30


def test_leftovers_behind_a_committed_checkpoint_go_once_keep_k_prunes_it() -> None:
    bucket = MemoryBucket()
    store = BucketCheckpointStore(f"{SETTINGS.url}/{JOB}", SETTINGS, keep=1, config_digest="d1", job=JOB, bucket=bucket)
    _plant(bucket, f"{PREFIX}/{folder_name(10)}", "w-0123456789ab/state.pt")  # the attempt before's, killed
    store.write(10, "fp32", _state(10))  # the next attempt's save of the same step: committed beside it
    for key in _below(bucket, 10):
        bucket.written[key] = LONG_AGO
    store.write(20, "fp32", _state(20))  # keep-K takes 10's checkpoint: what is left there is no save's
    store.write(30, "fp32", _state(30))
    assert _below(bucket, 10) == []


def test_a_backlog_of_killed_saves_drains_one_folder_a_save() -> None:
    bucket = MemoryBucket()
    store = _store(bucket)
    for step in (1, 2, 3):
        _plant(bucket, f"{PREFIX}/{folder_name(step)}", "w-0123456789ab/state.pt")
    store.write(10, "fp32", _state(10))
    assert [step for step, _ in store.steps()] == [2, 3, 10]
    store.write(20, "fp32", _state(20))
    assert [step for step, _ in store.steps()] == [3, 10, 20]


def test_what_a_prune_never_clears() -> None:
    bucket = MemoryBucket()
    store = _store(bucket)
    recent = _plant(bucket, f"{PREFIX}/{folder_name(5)}", "w-0123456789ab/state.pt", when=datetime.now(UTC))
    later = _plant(bucket, f"{PREFIX}/{folder_name(50)}", "w-0123456789ab/state.pt")  # above the step saved
    other = _plant(bucket, f"runs/ns/other/u2/{folder_name(2)}", "w-0123456789ab/state.pt")  # another job's
    store.write(10, "fp32", _state(10))
    store.write(20, "fp32", _state(20))
    assert set(recent + later + other) <= set(bucket.objects)  # a save still uploading; a run not gone on from


def test_a_folder_a_checkpoint_was_set_aside_from_stays_whole_and_the_next_is_cleared() -> None:
    bucket = MemoryBucket()
    store = _store(bucket)
    store.write(10, "fp32", _state(10))
    store.set_aside(store.url(10))  # its manifest below .corrupt/ (kept for diagnosis), its objects stay
    kept = _below(bucket, 10) + _plant(bucket, f"{PREFIX}/{folder_name(10)}", "w-0123456789ab/state.pt")
    for key in kept:
        bucket.written[key] = LONG_AGO
    _plant(bucket, f"{PREFIX}/{folder_name(15)}", "w-0123456789ab/state.pt")
    store.write(20, "fp32", _state(20))
    assert _below(bucket, 10) == sorted(kept) and _below(bucket, 15) == []
    store.write(30, "fp32", _state(30))
    assert _below(bucket, 10) == sorted(kept)


class LandsMeanwhile(MemoryBucket):
    """A bucket where a manifest lands in a folder between the prune's read and its listing (dated
    as long ago as the folder's files: the folder's age alone would not spare it)."""

    def ages(self, prefix: str, limit: int) -> dict[str, datetime]:
        _plant(self, prefix, MANIFEST)
        return super().ages(prefix, limit)


def test_a_folder_whose_manifest_lands_while_the_prune_looks_is_left() -> None:
    bucket = LandsMeanwhile()
    store = _store(bucket)
    left = _plant(bucket, f"{PREFIX}/{folder_name(5)}", "w-0123456789ab/state.pt")
    store.write(10, "fp32", _state(10))
    assert set(left) <= set(bucket.objects)
