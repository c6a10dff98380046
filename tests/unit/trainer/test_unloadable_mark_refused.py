"""A mark that cannot be written (checkpoint.unloadable.remember: a read-only volume, a bucket that
answers 403) is logged and the attempt goes on: the resume takes the checkpoint before the one
that did not load, this process still passes that one over, and a later process, finding no
mark, tries it again. Tests run as root, where a read-only folder does not stop a write: the
stores here refuse through their own surface (a volume store whose mark write fails with EROFS,
a bucket whose put answers AccessDenied as S3 does)."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from botocore.exceptions import ClientError

from mpjob_trainer.checkpoint import CheckpointStore, objects, resume
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.resume import Loaded
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"
Log = Callable[..., None]


class ReadOnlyVolume(CheckpointStore):
    """A volume store whose marks cannot be written: the volume went read-only."""

    def mark_unloadable(self, where: Path, sha256: str | None) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self.root / f".unloadable-{where.name}"))


class MarksForbidden(MemoryBucket):
    """A bucket whose policy lets the job write its checkpoints but not its marks."""

    def put(self, key: str, body: bytes) -> None:
        if f"/{objects.UNLOADABLE}/" in key:
            denied = ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "PutObject")
            raise self.refused(denied, f"store {key}")
        super().put(key, body)


@pytest.fixture(params=["volume", "bucket"])
def opens(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Log, bool], AnyStore]:
    """Opens the store of one place afresh (as a later process does): refusing marks, or not."""
    refusing, plain = MarksForbidden(), MemoryBucket()

    def open_(log: Log, refuse: bool) -> AnyStore:
        if request.param == "volume":
            volume = ReadOnlyVolume if refuse else CheckpointStore
            return volume(tmp_path, keep=5, config_digest="d1", log=log, job=JOB)
        plain.objects = refusing.objects  # one bucket's objects, whichever surface
        bucket = refusing if refuse else plain
        location = f"{SETTINGS.url}/ns/job/uid"
        return BucketCheckpointStore(location, SETTINGS, keep=5, config_digest="d1", job=JOB, log=log, bucket=bucket)

    return open_


def _restore(tried: list[int], bad: int | None) -> resume.Restore:
    def restore(loaded: Loaded) -> None:
        tried.append(loaded[0].step)
        if loaded[0].step == bad:
            raise CorruptCheckpoint(f"step {bad}: its state does not load")

    return restore


def test_a_mark_that_cannot_be_written_is_logged_and_the_resume_goes_on(
    opens: Callable[[Log, bool], AnyStore],
) -> None:
    log: list[dict[str, Any]] = []
    store = opens(lambda event, **fields: log.append({"event": event, **fields}), True)
    for step in (10, 20):
        store.write(step, "bf16", {"step": step, "w": torch.full((4,), float(step))})
    tried: list[int] = []
    loaded = resume.load(store, restore=_restore(tried, bad=20))
    assert loaded is not None and loaded[0].step == 10 and tried == [20, 10]
    twentieth = dict(store.steps())[20]
    assert store.unloadable == {twentieth}  # this process still knows
    problems = [e["problem"] for e in log if e["event"] == "checkpointRejected"]
    assert len(problems) == 2 and "marking it so failed" in problems[1], problems
    assert ("AccessDenied" in problems[1]) or ("Read-only file system" in problems[1]), problems[1]
    assert resume.load(store, restore=_restore(tried, bad=20)) is not None and tried[2:] == [10]

    later = opens(lambda *a, **k: None, False)
    assert later.unloadable_mark(twentieth) is None  # nothing was written
    again: list[int] = []
    assert resume.load(later, restore=_restore(again, bad=None)) is not None and again == [20]
