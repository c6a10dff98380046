"""The bucket checkpoint store against a real S3 server (the test cluster's versitygw): the
manifest is the commit, damaged checkpoints fall back to the previous good one, keep-K prunes
only this job's own, and a wrong bucket or credential is a configuration error naming the bucket."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.bucket import BucketMisconfigured, open_bucket
from mpjob_trainer.checkpoint.manifest import MANIFEST, STATE, folder_name
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.errors import ConfigError
from tests.cluster.s3 import CREDENTIALS, S3Server

pytestmark = pytest.mark.integration

DIGEST = "digest-1"


def store_of(settings: S3Storage, job: str = "ns/job/uid", keep: int = 3) -> BucketCheckpointStore:
    location = f"{settings.url}/ns/job/uid"
    return BucketCheckpointStore(location, settings, keep=keep, config_digest=DIGEST, job=job)


def state(step: int) -> dict[str, Any]:
    torch.manual_seed(step)
    return {"step": step, "weights": torch.randn(64, 64), "extra": {"lr": 0.1}}


def key(store: BucketCheckpointStore, step: int, name: str) -> str:
    """The object of `name` in `step`'s checkpoint: in the folder of the writer its manifest names."""
    prefix = f"{store.key}/{folder_name(step)}"
    if name == MANIFEST:
        return f"{prefix}/{name}"
    manifest = store.bucket.get(f"{prefix}/{MANIFEST}")
    assert manifest is not None
    return f"{prefix}/{json.loads(manifest)['writer']}/{name}"


def test_a_checkpoint_round_trips_and_its_ref_names_the_bucket(settings: S3Storage) -> None:
    store = store_of(settings)
    saved = store.write(10, "fp16", state(10))
    assert saved.ref.path == f"{settings.url}/ns/job/uid/step-000000010"
    loaded = resume.load(store_of(settings))
    assert loaded is not None
    ref, got = loaded
    assert ref == saved.ref
    assert torch.equal(got["weights"], state(10)["weights"]) and got["step"] == 10


def test_files_without_a_manifest_are_not_a_checkpoint(settings: S3Storage, raw: Any) -> None:
    store = store_of(settings)
    store.write(10, "fp16", state(10))
    store.write(20, "fp16", state(20))
    raw.delete_object(Bucket=settings.bucket, Key=key(store, 20, MANIFEST))  # an upload killed before its commit
    loaded = resume.load(store_of(settings))
    assert loaded is not None and loaded[0].step == 10


@pytest.mark.parametrize("damage", ["deleted-object", "corrupted-object", "manifest-without-objects"])
def test_a_damaged_checkpoint_is_rejected_for_the_previous_good_one(settings: S3Storage, raw: Any, damage: str) -> None:
    store = store_of(settings)
    store.write(10, "fp16", state(10))
    store.write(20, "fp16", state(20))
    if damage == "deleted-object":
        raw.delete_object(Bucket=settings.bucket, Key=key(store, 20, STATE))
    elif damage == "corrupted-object":
        body = bytearray(raw.get_object(Bucket=settings.bucket, Key=key(store, 20, STATE))["Body"].read())
        body[len(body) // 2] ^= 0xFF
        raw.put_object(Bucket=settings.bucket, Key=key(store, 20, STATE), Body=bytes(body))
    else:
        manifest = raw.get_object(Bucket=settings.bucket, Key=key(store, 20, MANIFEST))["Body"].read()
        raw.put_object(Bucket=settings.bucket, Key=key(store, 30, MANIFEST), Body=manifest)
    rejected: list[dict[str, Any]] = []
    reader = store_of(settings)
    reader.log = lambda event, **fields: rejected.append({"event": event, **fields})
    loaded = resume.load(reader)
    assert loaded is not None
    assert loaded[0].step == 10 if damage != "manifest-without-objects" else loaded[0].step == 20
    assert [r["event"] for r in rejected] == ["checkpointRejected"]


def test_keep_prunes_only_this_jobs_older_checkpoints(settings: S3Storage, raw: Any) -> None:
    other = store_of(settings, job="ns/other/uid2", keep=1)
    other.write(5, "fp16", state(5))  # another job's, in the same folder: never pruned
    store = store_of(settings, keep=2)
    for step in (10, 20, 30):
        store.write(step, "fp16", state(step))
    assert [s for s, _ in store.steps()] == [5, 20, 30]
    listed = raw.list_objects_v2(Bucket=settings.bucket, Prefix=f"{store.key}/{folder_name(10)}/")
    assert listed.get("KeyCount", 0) == 0


def test_a_large_checkpoint_goes_up_in_parts_and_comes_back_whole(settings: S3Storage) -> None:
    store = store_of(settings)
    big = {"step": 1, "weights": torch.randn(10 << 20)}  # 40 MiB: above the multipart threshold
    store.write(1, "bf16", big)
    loaded = resume.load(store_of(settings))
    assert loaded is not None and torch.equal(loaded[1]["weights"], big["weights"])
    assert store.metrics.checkpoint_upload_bytes._value.get() > 40 << 20


def test_a_missing_bucket_is_a_configuration_error_naming_it(s3_server: S3Server, creds: None) -> None:
    settings = S3Storage(bucket="no-such-bucket-here", endpoint=s3_server.endpoint)
    with pytest.raises(BucketMisconfigured, match="no-such-bucket-here") as caught:
        open_bucket(settings)
    assert isinstance(caught.value, ConfigError)


def test_a_wrong_credential_is_a_configuration_error_naming_the_bucket(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", CREDENTIALS["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(BucketMisconfigured, match=s3_server.bucket):
        open_bucket(S3Storage(bucket=s3_server.bucket, endpoint=s3_server.endpoint))


@pytest.fixture(autouse=True)
def _no_ambient_aws_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield
    assert os.environ.get("AWS_PROFILE") is None
