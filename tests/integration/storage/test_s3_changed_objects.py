"""What a restore reads from the bucket that no longer matches the manifest it checked makes that
checkpoint corrupt (rejected for the previous good one), never a bucket failure that ends the
resume: against the test cluster's real S3 server (versitygw)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint.bucket import open_bucket
from mpjob_trainer.checkpoint.bucket_files import BucketFiles
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, read_manifest
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
