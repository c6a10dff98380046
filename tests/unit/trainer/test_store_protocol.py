"""Resume order, the first valid checkpoint, keep-K pruning and ownership are written once
(checkpoint.resume, checkpoint.ownership) over checkpoint.protocol's Store: every store behaves
the same. Each test runs against the volume store and the bucket store (an in-memory bucket
with the store's own Bucket surface: memory_bucket)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore, CheckpointTaken, ownership, resume
from mpjob_trainer.checkpoint.manifest import MANIFEST, STATE, folder_name
from mpjob_trainer.checkpoint.ownership import CORRUPT_KEPT
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB, OTHER = "ns/job/uid", "ns/other/u2"
AnyStore = CheckpointStore | BucketCheckpointStore


@dataclass
class Place:
    """One place two jobs' stores share (a folder, or a prefix of a bucket), and how to damage
    what is stored there."""

    open: Callable[[str, int, Callable[..., None]], AnyStore]
    overwrite: Callable[[int, str, bytes], None]
    #: How many files (objects) hold `body`, wherever they are.
    holding: Callable[[bytes], int]
    log: list[dict[str, Any]] = field(default_factory=list)

    def store(self, job: str = JOB, keep: int = 5) -> AnyStore:
        return self.open(job, keep, lambda event, **fields: self.log.append({"event": event, **fields}))


def _volume(root: Path) -> Place:
    def open_(job: str, keep: int, log: Callable[..., None]) -> AnyStore:
        return CheckpointStore(root, keep=keep, config_digest="d1", log=log, job=job)

    def overwrite(step: int, name: str, body: bytes) -> None:
        (root / folder_name(step) / name).write_bytes(body)

    return Place(open_, overwrite, lambda body: sum(p.read_bytes() == body for p in root.rglob("*") if p.is_file()))


def _bucket() -> Place:
    bucket, location = MemoryBucket(), f"{SETTINGS.url}/ns/job/uid"

    def open_(job: str, keep: int, log: Callable[..., None]) -> AnyStore:
        return BucketCheckpointStore(location, SETTINGS, keep=keep, config_digest="d1", job=job, log=log, bucket=bucket)

    def overwrite(step: int, name: str, body: bytes) -> None:
        prefix = f"runs/ns/job/uid/{folder_name(step)}"  # a file goes where the manifest there names it
        writer = json.loads(bucket.objects[f"{prefix}/{MANIFEST}"]).get("writer") if name != MANIFEST else None
        bucket.objects[f"{prefix}/{writer}/{name}" if writer else f"{prefix}/{name}"] = body

    return Place(open_, overwrite, lambda body: sum(found == body for found in bucket.objects.values()))


@pytest.fixture(params=["volume", "bucket"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    return _volume(tmp_path) if request.param == "volume" else _bucket()


def _save(store: AnyStore, step: int, precision: str = "bf16") -> None:
    store.write(step, precision, {"step": step, "w": torch.full((4,), float(step))})


def _steps(store: AnyStore) -> list[int]:
    return [step for step, _ in store.steps()]


def _at(store: AnyStore, step: int) -> str:
    return str(dict(store.steps())[step])


def test_resume_takes_newer_ones_in_the_attempts_precision_then_the_named_one_then_newest_first(
    place: Place,
) -> None:
    store = place.store()
    for step, precision in [(10, "bf16"), (20, "fp16"), (30, "bf16"), (40, "fp16"), (50, "bf16")]:
        _save(store, step, precision)
    order = resume.candidates(store, _at(store, 20), newer_in="bf16")
    assert [_at(store, s) for s in (50, 30, 20, 40, 10)] == [str(where) for where in order]
    assert [str(where) for where in resume.candidates(store, None)] == [_at(store, s) for s in (50, 40, 30, 20, 10)]
    loaded = resume.load(place.store(), _at(store, 20), newer_in="fp16")
    assert loaded is not None and loaded[0].step == 40 and loaded[1]["step"] == 40


def test_a_corrupt_newest_checkpoint_is_logged_and_the_previous_good_one_is_used(place: Place) -> None:
    store = place.store()
    for step in (10, 20, 30):
        _save(store, step)
    place.overwrite(30, STATE, b"damaged")
    place.overwrite(20, MANIFEST, b"{not json")
    reader = place.store()
    loaded = resume.load(reader)
    assert loaded is not None and loaded[0].step == 10 and torch.equal(loaded[1]["w"], torch.full((4,), 10.0))
    rejected = [(e["event"], e["path"]) for e in place.log]
    assert rejected == [("checkpointRejected", _at(store, 30)), ("checkpointRejected", _at(store, 20))]


def test_keep_prunes_only_this_jobs_oldest_checkpoints(place: Place) -> None:
    other = place.store(OTHER)
    for step in (5, 15):
        _save(other, step)
    store = place.store(keep=2)
    for step in (10, 20, 30, 40):
        _save(store, step)
    assert _steps(store) == [5, 15, 30, 40]
    assert [step for step, where in store.steps() if ownership.wrote(store, where)] == [30, 40]


def test_keep_never_prunes_a_save_for_this_jobs_checkpoints_of_later_steps(place: Place) -> None:
    store = place.store(keep=2)
    for step in (200, 300):
        _save(store, step)
    for step in (200, 300):  # damaged: a resume passes over both and starts at step 0
        place.overwrite(step, STATE, b"damaged")
    saved = store.write(50, "bf16", {"step": 50, "w": torch.full((4,), 50.0)}).ref
    loaded = resume.load(place.store())
    assert loaded is not None and loaded[0].path == saved.path and loaded[0].sha256 == saved.sha256
    for step in (100, 150):
        _save(store, step)
    assert _steps(store) == [100, 150, 200, 300]  # keep-K counts up to the save: 50 goes, 200 and 300 stay


def test_a_save_refuses_a_step_another_job_holds_or_that_holds_no_valid_manifest(place: Place) -> None:
    _save(place.store(OTHER), 20)
    store = place.store()
    with pytest.raises(CheckpointTaken):
        _save(store, 20)
    _save(store, 30)
    place.overwrite(30, MANIFEST, b"[]")
    with pytest.raises(CheckpointTaken):
        _save(store, 30)
    loaded = resume.load(place.store(OTHER))
    assert loaded is not None and loaded[0].step == 20  # the other job's checkpoint is as it was


def test_a_save_keeps_its_jobs_valid_checkpoint_and_replaces_a_damaged_one(place: Place) -> None:
    store = place.store()
    _save(store, 20)
    first = resume.load(store)
    store.write(20, "bf16", {"step": 20, "w": torch.zeros(4)})
    kept = resume.load(store)
    assert first is not None and kept is not None and kept[0].sha256 == first[0].sha256
    place.overwrite(20, STATE, b"damaged")
    store.write(20, "bf16", {"step": 20, "w": torch.zeros(4)})
    loaded = resume.load(place.store())
    assert loaded is not None and torch.equal(loaded[1]["w"], torch.zeros(4))


def test_of_the_checkpoints_set_aside_as_damaged_the_newest_are_kept_and_the_rest_deleted(place: Place) -> None:
    store = place.store(keep=10)
    for step in (10, 20, 30, 40, 50):
        _save(store, step)
        place.overwrite(step, STATE, b"damaged %d" % step)
        _save(store, step)  # finds it damaged: set aside, replaced
    assert len(store.aside()) == CORRUPT_KEPT
    kept = [place.holding(b"damaged %d" % step) for step in (10, 20, 30, 40, 50)]
    assert kept == [0] * (5 - CORRUPT_KEPT) + [1] * CORRUPT_KEPT
    assert _steps(store) == [10, 20, 30, 40, 50] and resume.load(place.store()) is not None


def test_a_copy_of_another_steps_checkpoint_is_not_its_steps_and_a_save_replaces_it(
    place: Place, tmp_path_factory: pytest.TempPathFactory
) -> None:
    store = place.store()
    for step in (10, 20):
        _save(store, step)
    copy = CheckpointStore(tmp_path_factory.mktemp("copy"), keep=5, config_digest="d1", job=JOB)
    _save(copy, 10)
    for name in (MANIFEST, STATE):  # step 10's checkpoint, byte for byte, in step 20's place
        place.overwrite(20, name, (copy.root / folder_name(10) / name).read_bytes())
    reader = place.store()
    loaded = resume.load(reader)
    assert loaded is not None and loaded[0].step == 10 and loaded[0].path == _at(store, 10)
    assert [e["path"] for e in place.log] == [_at(store, 20)] and "of step 10" in place.log[0]["problem"]
    assert reader.write(20, "bf16", {"step": 20, "w": torch.zeros(4)}).ref.step == 20
    loaded = resume.load(place.store())
    assert loaded is not None and loaded[0].step == 20 and torch.equal(loaded[1]["w"], torch.zeros(4))
