"""What a bucket save that never commits leaves, and when it goes (checkpoint.leftovers).

A save whose manifest put fails deletes the files it uploaded, unless the bucket says the
manifest landed all the same (an answer lost after the server stored it: the checkpoint is
committed, and deleting what it names would leave it naming nothing). The bucket runs in memory
with the store's own Bucket surface (memory_bucket); its manifest puts fail as told."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import resume
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
    bucket, log = FailingCommits(), []
    store = _store(bucket, log)
    bucket.failing = bucket.gone = True
    with pytest.raises(ConnectionError, match="put"):
        store.write(20, "fp32", _state(20))
    assert [key.rsplit("/", 1)[-1] for key in _below(bucket, 20)] == ["state.pt"]
    (left,) = [line for line in log if line["event"] == "checkpointUploadsLeft"]
    assert left["prefix"].startswith(f"{PREFIX}/{folder_name(20)}/w-") and "get" in left["problem"]
    json.dumps(left)
