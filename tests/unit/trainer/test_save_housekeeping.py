"""A save is written once its commit point has passed (a bucket's manifest put, a volume's rename
made durable): what follows it (keep-K's pruning of older checkpoints) may fail without unwriting
it. The save is reported as the checkpoint, the housekeeping's failure beside it, and the next
save's housekeeping does what was left. Before the commit point a failure is a save not written,
and what it left is never taken for a checkpoint.

The stores run over real storage: a folder, and a bucket with the store's own Bucket surface
(memory_bucket) whose housekeeping requests (listing, deleting) can be cut."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from botocore.exceptions import ClientError

from mpjob_trainer.checkpoint import CheckpointStore, resume
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"
PREFIX = "runs/ns/job/uid"


class CutBucket(MemoryBucket):
    """A bucket whose listings and deletes fail while `cut` names them (an outage that began
    after the manifest went up); the puts that commit still land until `cut` names them too."""

    def __init__(self) -> None:
        super().__init__()
        self.cut: set[str] = set()
        #: Deletes that still land before every further one fails (None: no limit).
        self.deletes_left: int | None = None

    def _refuse(self, what: str) -> None:
        if what in self.cut:
            raise ConnectionError(f"Could not connect to the endpoint URL: {what}")

    def folders(self, prefix: str, limit: int) -> list[str]:
        self._refuse("list")
        return super().folders(prefix, limit)

    def delete(self, keys: list[str]) -> None:
        self._refuse("delete")
        for key in keys:  # one request a key, as Bucket.delete makes them
            if self.deletes_left is not None:
                if self.deletes_left == 0:
                    raise ConnectionError(f"Could not connect to the endpoint URL: delete {key}")
                self.deletes_left -= 1
            super().delete([key])

    def put(self, key: str, body: bytes) -> None:
        self._refuse("put")
        super().put(key, body)

    def upload(self, key: str, path: Path) -> None:
        self._refuse("upload")
        super().upload(key, path)


def _state(step: int) -> dict[str, Any]:
    return {"step": step, "model": {"w": torch.full((4,), float(step))}}


def _bucket_store(bucket: CutBucket, keep: int = 2) -> BucketCheckpointStore:
    return BucketCheckpointStore(
        f"{SETTINGS.url}/{JOB}", SETTINGS, keep=keep, config_digest="d1", job=JOB, bucket=bucket
    )


def _committed(bucket: MemoryBucket) -> list[int]:
    return sorted(
        int(key.split("/")[-2].removeprefix("step-")) for key in bucket.objects if key.endswith(f"/{MANIFEST}")
    )


def test_a_bucket_save_whose_prune_fails_after_its_manifest_is_written_and_says_what_was_left() -> None:
    bucket = CutBucket()
    store = _bucket_store(bucket)
    for step in (10, 20):
        assert store.write(step, "fp32", _state(step)).housekeeping is None
    bucket.cut = {"list"}  # the outage begins right after the commit: keep-K cannot list the steps
    result = store.write(30, "fp32", _state(30))
    assert (result.ref.step, result.ref.path) == (30, f"{SETTINGS.url}/{JOB}/{folder_name(30)}")
    assert result.housekeeping is not None
    assert result.housekeeping.startswith("older checkpoints not pruned: ConnectionError")
    assert _committed(bucket) == [10, 20, 30]
    bucket.cut = set()  # the next save's housekeeping prunes what this one left
    assert store.write(40, "fp32", _state(40)).housekeeping is None
    assert _committed(bucket) == [30, 40]


def test_a_prune_cut_between_its_deletes_is_redone_by_the_next_save_and_leaves_no_object() -> None:
    bucket = CutBucket()
    store = _bucket_store(bucket, keep=1)
    store.write(10, "fp32", _state(10))
    bucket.deletes_left = 1  # the prune's first delete request lands, then the bucket is gone
    assert store.write(20, "fp32", _state(20)).housekeeping is not None
    bucket.deletes_left = None
    assert store.write(30, "fp32", _state(30)).housekeeping is None
    assert _committed(bucket) == [30]
    assert all(f"/{folder_name(10)}/" not in key for key in bucket.objects), sorted(bucket.objects)


def test_a_bucket_save_whose_manifest_put_fails_is_not_written_and_never_resumed_from(tmp_path: Path) -> None:
    bucket = CutBucket()
    store = _bucket_store(bucket)
    store.write(10, "fp32", _state(10))
    bucket.cut = {"put"}
    with pytest.raises(ConnectionError):
        store.write(20, "fp32", _state(20))
    bucket.cut = set()
    assert _committed(bucket) == [10]
    bucket.objects[f"{PREFIX}/{folder_name(20)}/w-000000000000/state.pt"] = b"left by a killed save"
    loaded = resume.load(store, None, restore=lambda loaded: None)
    assert loaded is not None and loaded[0].step == 10


class UntidyVolume(CheckpointStore):
    """A volume whose step folders cannot be listed once `cut` (keep-K's first request)."""

    cut = False

    def steps(self) -> list[tuple[int, Path]]:
        if self.cut:
            raise OSError(5, "Input/output error", str(self.root))
        return super().steps()


def test_a_volume_save_whose_prune_fails_after_its_rename_is_written_and_pruned_next_time(tmp_path: Path) -> None:
    store = UntidyVolume(tmp_path, keep=1, config_digest="d1", job=JOB)
    store.write(10, "fp32", _state(10))
    store.cut = True
    result = store.write(20, "fp32", _state(20))
    assert result.ref.path == str(tmp_path / folder_name(20))
    assert result.housekeeping is not None and "Input/output error" in result.housekeeping
    store.cut = False
    assert store.write(30, "fp32", _state(30)).housekeeping is None
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-")) == [folder_name(30)]


def test_the_run_records_the_checkpoint_and_warns_of_the_housekeeping_apart() -> None:
    bucket = CutBucket()
    out = io.StringIO()
    store = _bucket_store(bucket)
    checkpointer = Checkpointer(
        store, World(rank=0, size=1, local_rank=0), EventLog(stream=out), TrainerMetrics("job", "ns", 0, "fp32")
    )
    for step in (10, 20):
        checkpointer.save(step, "fp32", lambda step=step: _state(step), final=False)
    checkpointer.collect(block=True, training_step=20)
    bucket.cut = {"list"}
    checkpointer.save(30, "fp32", lambda: _state(30), final=True)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["step"] for line in lines if line["event"] == "checkpoint"] == [10, 20, 30]
    assert not [line for line in lines if line["event"] == "checkpointFailed"]
    (left,) = [line for line in lines if line["event"] == "checkpointHousekeepingFailed"]
    assert left["step"] == 30 and left["problem"].startswith("older checkpoints not pruned: ConnectionError")
    assert checkpointer.last_good is not None and checkpointer.last_good.step == 30


def test_what_a_bucket_store_logs_of_its_uploads_is_a_line_of_the_event_log() -> None:
    """The store logs through the attempt's EventLog, which refuses events the contract does not
    know: a withdraw that failed and the aborted uploads of killed saves are lines of their own,
    never a ValueError in place of the save's failure or at the attempt's start."""

    class Unfinished(CutBucket):
        def abort_uploads(self, prefix: str) -> int:
            return 2

    bucket, out = Unfinished(), io.StringIO()
    store = BucketCheckpointStore(
        f"{SETTINGS.url}/{JOB}", SETTINGS, keep=2, config_digest="d1", job=JOB, bucket=bucket, log=EventLog(stream=out)
    )
    store.clean_stale()
    bucket.cut = {"upload", "delete"}
    with pytest.raises(ConnectionError):
        store.write(10, "fp32", _state(10))
    lines = {line["event"]: line for line in map(json.loads, out.getvalue().splitlines())}
    assert lines["checkpointUploadsAborted"]["count"] == 2
    assert lines["checkpointUploadsLeft"]["prefix"].startswith(f"{PREFIX}/{folder_name(10)}/w-")


class ServerErrors(MemoryBucket):
    """A bucket whose server answers a delete with 500 InternalError (botocore's retries spent):
    through Bucket.refused, as Bucket.delete raises it."""

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            error = {"Code": "InternalError", "Message": "We encountered an internal error. Please try again."}
            failed = ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 500}}, "DeleteObject")
            raise self.refused(failed, f"delete {key}")


def test_a_delete_the_server_refuses_names_the_key_in_the_housekeeping() -> None:
    bucket = ServerErrors()
    store = _bucket_store(bucket, keep=1)
    store.write(10, "fp32", _state(10))
    left = store.write(20, "fp32", _state(20)).housekeeping
    assert left is not None and left.startswith("older checkpoints not pruned: BucketFailed: ")
    assert f"delete {PREFIX}/{folder_name(10)}/" in left, left
    assert f"{SETTINGS.bucket!r} at {SETTINGS.endpoint}" in left and "InternalError" in left, left
    assert _committed(bucket) == [10, 20]
