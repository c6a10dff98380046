"""Writers of one bucket, against a real S3 server (the test cluster's versitygw): two writers of
one step (an attempt's pod still saving beside the next one's) never mix their objects and the
first commit stays (a later manifest of its step is refused), a
checkpoint written before writers had folders of their own is still read and pruned, the
checkpoints set aside as damaged are bounded as on a volume (with their objects), and a save
whose upload fails leaves none of its objects behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import CheckpointStore, resume
from mpjob_trainer.checkpoint.manifest import MANIFEST, STATE, folder_name, read_manifest, sha256_file
from mpjob_trainer.checkpoint.objects import ASIDE, new_writer
from mpjob_trainer.checkpoint.ownership import CORRUPT_KEPT, CheckpointTaken
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

pytestmark = pytest.mark.integration

JOB = "ns/job/uid"


def store_of(settings: S3Storage, log: list[dict[str, Any]] | None = None, keep: int = 10) -> BucketCheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    location = f"{settings.url}/ns/job/uid"
    return BucketCheckpointStore(location, settings, keep=keep, config_digest="d1", job=JOB, log=record)


def state(step: int, value: float) -> dict[str, Any]:
    return {"step": step, "w": torch.full((1024,), value)}


def keys(raw: Any, settings: S3Storage, prefix: str) -> set[str]:
    listed = raw.list_objects_v2(Bucket=settings.bucket, Prefix=f"{prefix}/", MaxKeys=1000)
    return {o["Key"] for o in listed.get("Contents", [])}


def file_key(raw: Any, store: BucketCheckpointStore, step: int, name: str) -> str:
    """Where the committed manifest of `step` says its file `name` lies."""
    prefix = f"{store.key}/{folder_name(step)}"
    manifest = json.loads(raw.get_object(Bucket=store.bucket.name, Key=f"{prefix}/{MANIFEST}")["Body"].read())
    return f"{prefix}/{manifest['writer']}/{name}" if manifest.get("writer") else f"{prefix}/{name}"


def test_a_committed_checkpoint_is_never_replaced_by_a_later_manifest_of_its_step(
    settings: S3Storage, raw: Any
) -> None:
    """Writer B saves step 20 whole while writer A uploads the same step (B's commit lands between
    A's files and A's manifest): B's checkpoint, committed and reported, stays as it is; A's
    manifest is refused, A reports B's checkpoint (this job's, valid: kept) and its own files go."""
    first, second = store_of(settings), store_of(settings)
    first.write(10, "bf16", state(10, 1.0))
    raced: list[Any] = []

    def the_other_saves_first(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key", "").endswith(f"{folder_name(20)}/{MANIFEST}") and not raced:
            raced.append(second.write(20, "bf16", state(20, 3.0)).ref)

    first.bucket.client.meta.events.register("before-parameter-build.s3.PutObject", the_other_saves_first)
    reported = first.write(20, "bf16", state(20, 2.0)).ref
    assert raced and reported == raced[0]  # the one there, kept: never overwritten
    log: list[dict[str, Any]] = []
    loaded = resume.load(store_of(settings, log))
    assert loaded is not None and loaded[0] == raced[0]
    assert torch.equal(loaded[1]["w"], state(20, 3.0)["w"]) and log == []
    step_keys = keys(raw, settings, f"{first.key}/{folder_name(20)}")
    assert step_keys == {f"{first.key}/{folder_name(20)}/{MANIFEST}", file_key(raw, first, 20, STATE)}


def test_a_sharded_commit_never_replaces_another_jobs_checkpoint_that_landed_after_its_claim(
    settings: S3Storage, raw: Any, tmp_path: Path
) -> None:
    """Rank 0 found step 30 free and the ranks uploaded; before its commit another job's save of
    that step landed: the commit writes nothing (CheckpointTaken), the other job's checkpoint stays
    whole and this save's files go."""
    store = store_of(settings)
    other = BucketCheckpointStore(f"{settings.url}/ns/job/uid", settings, keep=10, config_digest="d1", job="ns/b/u")
    assert store.taken(30) is None
    (tmp_path / "rank-0.pt").write_bytes(b"r" * 64)
    files = {"rank-0.pt": {"sha256": sha256_file(tmp_path / "rank-0.pt"), "bytes": 64}}
    writer = new_writer()
    store.publish(30, tmp_path, files, writer=writer)
    theirs = other.write(30, "bf16", state(30, 4.0)).ref
    with pytest.raises(CheckpointTaken):
        store.commit(tmp_path / "spool", 30, "bf16", files, world_size=1, writer=writer)
    _, loaded = other.verify(other.url(30), alone=True)
    assert torch.equal(loaded["w"], state(30, 4.0)["w"]) and other.manifest(other.url(30)).job == "ns/b/u"  # type: ignore[union-attr]
    assert not any(f"/{writer}/" in key for key in keys(raw, settings, f"{store.key}/{folder_name(30)}"))
    assert theirs.step == 30


def legacy_write(raw: Any, store: BucketCheckpointStore, tmp: Path, step: int, value: float) -> None:
    """A checkpoint as writers without folders of their own put it: every file directly below the
    step's prefix, then the manifest (no `writer`), last."""
    volume = CheckpointStore(tmp, keep=10, config_digest="d1", job=JOB)
    folder = Path(volume.write(step, "bf16", state(step, value)).ref.path)
    prefix = f"{store.key}/{folder.name}"
    for name in read_manifest(folder).files:
        raw.upload_file(str(folder / name), store.bucket.name, f"{prefix}/{name}")
    raw.upload_file(str(folder / MANIFEST), store.bucket.name, f"{prefix}/{MANIFEST}")
    assert "writer" not in json.loads((folder / MANIFEST).read_text())


def test_a_checkpoint_without_a_writer_folder_is_read_and_pruned(settings: S3Storage, raw: Any, tmp_path: Path) -> None:
    store = store_of(settings, keep=1)
    legacy_write(raw, store, tmp_path, 10, 5.0)
    loaded = resume.load(store_of(settings))
    assert loaded is not None and loaded[0].step == 10 and torch.equal(loaded[1]["w"], state(10, 5.0)["w"])
    store.write(20, "bf16", state(20, 6.0))  # keep=1: the old one goes, its objects with it
    assert keys(raw, settings, f"{store.key}/{folder_name(10)}") == set()
    assert [step for step, _ in store.steps()] == [20]


def test_checkpoints_set_aside_in_a_bucket_are_bounded_with_their_objects(settings: S3Storage, raw: Any) -> None:
    """A job that keeps damaging checkpoints keeps the newest CORRUPT_KEPT it set aside: the
    older ones' objects go; its live checkpoints, another job's set-aside one and anything
    outside the job's prefix stay."""
    outside = f"{settings.prefix}/ns/job/elsewhere.bin"
    raw.put_object(Bucket=settings.bucket, Key=outside, Body=b"not the job's")
    other = BucketCheckpointStore(
        f"{settings.url}/ns/job/uid", settings, keep=10, config_digest="d2", job="ns/other/u2"
    )
    other.write(5, "bf16", state(5, 0.5))
    other.unloadable.add(other.url(5))
    other.write(5, "bf16", state(5, 0.6))  # set aside by the other job
    store = store_of(settings)
    aside: list[str] = []  # the damaged checkpoints' state objects, oldest first
    for step in (10, 20, 30, 40, 50):
        store.write(step, "bf16", state(step, 1.0))
        aside.append(file_key(raw, store, step, STATE))
        body = bytearray(raw.get_object(Bucket=settings.bucket, Key=aside[-1])["Body"].read())
        body[len(body) // 2] ^= 0xFF
        raw.put_object(Bucket=settings.bucket, Key=aside[-1], Body=bytes(body))
        store.write(step, "bf16", state(step, 2.0))  # finds it damaged: set aside, replaced
    everything = keys(raw, settings, settings.prefix)
    assert [key in everything for key in aside] == [False] * (5 - CORRUPT_KEPT) + [True] * CORRUPT_KEPT
    assert outside in everything and file_key(raw, store, 5, STATE) in everything
    records = {key.split("/")[-2] for key in everything if f"/{ASIDE}/" in key}
    assert len(records) == CORRUPT_KEPT + 1  # the other job's besides
    for step in (10, 20, 30, 40, 50):
        _, loaded = store.verify(store.url(step), alone=True)
        assert torch.equal(loaded["w"], state(step, 2.0)["w"])


def test_a_save_whose_upload_fails_leaves_none_of_its_objects(settings: S3Storage, raw: Any, tmp_path: Path) -> None:
    store = store_of(settings)
    (tmp_path / "a.bin").write_bytes(b"a" * 4096)
    files = {name: {"sha256": sha256_file(tmp_path / "a.bin"), "bytes": 4096} for name in ("a.bin", "b.bin")}
    with pytest.raises(OSError):  # b.bin is not there to upload: the save fails after a.bin went up
        store.publish(30, tmp_path, files, writer=new_writer())
    assert keys(raw, settings, f"{store.key}/{folder_name(30)}") == set()
