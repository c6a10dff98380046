"""What a restore reads from the bucket that no longer matches the manifest it checked makes that
checkpoint corrupt (rejected for the previous good one), never a bucket failure that ends the
resume: against the test cluster's real S3 server (versitygw)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.bucket import MULTIPART_BYTES, open_bucket
from mpjob_trainer.checkpoint.bucket_files import BucketFiles
from mpjob_trainer.checkpoint.manifest import MANIFEST, STATE, CorruptCheckpoint, folder_name, read_manifest
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.shard_copies import CheckedShards
from tests.unit.trainer.test_checked_shards import commit, store_at

pytestmark = pytest.mark.integration

SHARD = "__0_0.distcp"


def test_a_ranged_read_past_the_end_of_a_shard_replaced_by_a_shorter_one_is_a_corrupt_checkpoint(
    tmp_path: Path, settings: S3Storage, raw: Any
) -> None:
    """Another rank's share of a sharded checkpoint is read by range, at the offsets its checked
    index gives; the object replaced since by a shorter one (the bucket answers 416 InvalidRange
    for a range past its end) rejects this checkpoint, as a changed one does."""
    folder = commit(store_at(tmp_path / "written"), 20, width=64)
    prefix = f"{settings.prefix}/step-000000020"
    for path in folder.iterdir():
        raw.put_object(Bucket=settings.bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    shards = CheckedShards(
        BucketFiles(open_bucket(settings), prefix, tmp_path / "step-000000020"), read_manifest(folder).files
    )
    shards.values = shards.check_share([SHARD], resharded=True)
    shards.drop(SHARD)
    name, offset, length = max(shards.values, key=lambda span: span[1])
    assert name == SHARD and offset > 16
    raw.put_object(Bucket=settings.bucket, Key=f"{prefix}/{SHARD}", Body=b"x" * 16)  # replaced: shorter
    with pytest.raises(CorruptCheckpoint, match=f"{SHARD} missing or shorter in the bucket"):
        shards.read(name, offset, length)
    shards.close()


def test_an_object_replaced_while_its_parts_download_is_a_corrupt_checkpoint(
    tmp_path: Path, settings: S3Storage, raw: Any
) -> None:
    """An object large enough to download in parts, replaced after its first part was read: the
    bucket refuses the later parts (they ask for the object whose first part was read, If-Match),
    and the checkpoint is rejected as changed, as one replaced before its download is."""
    key = f"{settings.prefix}/step-000000020/{SHARD}"
    size = 3 * MULTIPART_BYTES
    raw.put_object(Bucket=settings.bucket, Key=key, Body=b"a" * size)
    bucket = open_bucket(settings)
    gets: list[str] = []

    def replace_after_the_first(model: Any, **_: Any) -> None:
        gets.append(model.name)
        if len(gets) == 1:
            raw.put_object(Bucket=settings.bucket, Key=key, Body=b"b" * size)

    bucket.client.meta.events.register("after-call.s3.GetObject", replace_after_the_first)
    source = BucketFiles(bucket, f"{settings.prefix}/step-000000020", tmp_path / "step-000000020")
    with pytest.raises(CorruptCheckpoint, match=f"{SHARD} changed in the bucket while it was read"):
        source.copy(SHARD, {"bytes": size, "sha256": "0" * 64}, lambda chunk: None)
    assert len(gets) > 1


def test_a_checkpoint_replaced_while_it_downloads_falls_back_to_the_previous_good_one(
    settings: S3Storage, raw: Any
) -> None:
    """The resume, end to end: the newest checkpoint's state replaced in the bucket (same size,
    other bytes) after the first part of its download; the previous good one is resumed from."""
    location = f"{settings.url}/ns/job/uid"

    def store() -> BucketCheckpointStore:
        return BucketCheckpointStore(location, settings, keep=3, config_digest="d1", job="ns/job/uid")

    writer = store()
    for step in (10, 20):
        writer.write(step, "fp16", {"step": step, "weights": torch.full((3 * MULTIPART_BYTES // 4,), float(step))})
    prefix = f"{writer.key}/{folder_name(20)}"
    manifest = json.loads(raw.get_object(Bucket=settings.bucket, Key=f"{prefix}/{MANIFEST}")["Body"].read())
    key = f"{prefix}/{manifest['writer']}/{STATE}"
    planted = raw.get_object(Bucket=settings.bucket, Key=key)["Body"].read()[::-1]
    reader, gets = store(), []

    def replace_before_the_second(params: dict[str, Any], **_: Any) -> None:
        if params["Key"] == key:
            gets.append(params.get("Range"))
            if len(gets) == 2:  # the first part read: the next ones ask for its ETag (If-Match)
                raw.put_object(Bucket=settings.bucket, Key=key, Body=planted)

    reader.bucket.client.meta.events.register("before-parameter-build.s3.GetObject", replace_before_the_second)
    loaded = resume.load(reader)
    assert len(gets) > 1
    assert loaded is not None and loaded[0].step == 10
