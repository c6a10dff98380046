"""A restore and a prune cost a bounded number of requests to the bucket, however many step
folders its job's prefix holds, and what the bucket says of a checkpoint's size is checked
before anything is downloaded: an oversize manifest or object is a corrupt checkpoint, and
the previous good one is used. Against the test cluster's real S3 server (versitygw), the
store's own boto3 client counted through botocore's event hooks."""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.bucket import LIST_PAGE
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.manifest import MANIFEST, STATE, folder_name
from mpjob_trainer.checkpoint.protocol import MAX_EXAMINED
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

pytestmark = pytest.mark.integration

#: Steps a test plants: three listing pages (S3 lists 1,000 keys a page), so a bounded restore
#: or prune has pages it must not read all of.
PLANTED = 2500


def store_of(settings: S3Storage, log: list[dict[str, Any]] | None = None) -> BucketCheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    location = f"{settings.url}/ns/job/uid"
    return BucketCheckpointStore(location, settings, keep=2, config_digest="d1", job="ns/job/uid", log=record)


def counted(store: BucketCheckpointStore) -> Counter[str]:
    """Every request the store's client makes from now on, by operation."""
    calls: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    store.bucket.client.meta.events.register("before-call.s3", count)
    return calls


def state(step: int) -> dict[str, Any]:
    return {"step": step, "w": torch.full((256,), float(step))}


def plant_steps(raw: Any, store: BucketCheckpointStore, steps: range) -> None:
    """A folder for each of `steps` holding a state file and no manifest (a killed save's, or
    anyone's): each is a step the listing names, none is a checkpoint."""

    def put(step: int) -> None:
        raw.put_object(Bucket=store.bucket.name, Key=f"{store.key}/{folder_name(step)}/{STATE}", Body=b"x")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, steps))


def test_a_restore_past_thousands_of_listed_steps_costs_a_bounded_number_of_requests(
    settings: S3Storage, raw: Any
) -> None:
    writer = store_of(settings)
    writer.write(1, "bf16", state(1))
    plant_steps(raw, writer, range(2, 2 + PLANTED))
    log: list[dict[str, Any]] = []
    reader = store_of(settings, log)
    calls = counted(reader)
    assert resume.load(reader) is None  # step 1 lies past the newest MAX_EXAMINED: not tried
    listings = -(-(PLANTED + 1) // 1000)
    assert calls["ListObjectsV2"] <= listings + 1 and calls["GetObject"] <= MAX_EXAMINED
    assert sum(calls.values()) <= listings + 1 + MAX_EXAMINED, calls
    assert [e["event"] for e in log].count("checkpointRejected") == MAX_EXAMINED
    assert any(e["event"] == "checkpointCandidatesCapped" and e["found"] == PLANTED + 1 for e in log)


def test_a_save_prunes_past_thousands_of_listed_steps_in_a_bounded_number_of_requests(
    settings: S3Storage, raw: Any
) -> None:
    writer = store_of(settings)
    plant_steps(raw, writer, range(1, 1 + PLANTED))
    writer.write(PLANTED + 10, "bf16", state(10))
    calls = counted(writer)
    writer.write(PLANTED + 20, "bf16", state(20))
    writer.write(PLANTED + 30, "bf16", state(30))  # prunes the first of the three
    assert sum(calls.values()) <= 2 * (2 * 6 + 2 + MAX_EXAMINED + 2), calls
    assert [s for s, _ in writer.steps()][-2:] == [PLANTED + 20, PLANTED + 30]


def test_an_oversize_manifest_is_a_corrupt_checkpoint(settings: S3Storage, raw: Any) -> None:
    writer = store_of(settings)
    writer.write(10, "bf16", state(10))
    writer.write(20, "bf16", state(20))
    key = f"{writer.key}/{folder_name(20)}/{MANIFEST}"
    body = raw.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
    padded = body.rstrip()[:-1] + b" " * (MAX_MANIFEST_BYTES + 1 - len(body)) + b"}"  # still valid JSON
    raw.put_object(Bucket=settings.bucket, Key=key, Body=padded)
    log: list[dict[str, Any]] = []
    loaded = resume.load(store_of(settings, log))
    assert loaded is not None and loaded[0].step == 10
    assert [e["event"] for e in log] == ["checkpointRejected"] and "bytes" in log[0]["problem"]


def test_an_object_larger_than_its_manifest_says_is_never_downloaded(settings: S3Storage, raw: Any) -> None:
    writer = store_of(settings)
    writer.write(10, "bf16", state(10))
    writer.write(20, "bf16", state(20))
    manifest = json.loads(
        raw.get_object(Bucket=settings.bucket, Key=f"{writer.key}/{folder_name(20)}/{MANIFEST}")["Body"].read()
    )
    key = f"{writer.key}/{folder_name(20)}/{manifest['writer']}/{STATE}"
    body = raw.get_object(Bucket=settings.bucket, Key=key)["Body"].read()
    raw.put_object(Bucket=settings.bucket, Key=key, Body=body + b"\0" * (8 << 20))  # a planted giant
    log: list[dict[str, Any]] = []
    reader = store_of(settings, log)
    fetched: list[str] = []
    reader.bucket.client.meta.events.register(
        "before-parameter-build.s3", lambda params, **_: fetched.append(params.get("Key", ""))
    )
    loaded = resume.load(reader)
    assert loaded is not None and loaded[0].step == 10
    assert key not in fetched and [e["event"] for e in log] == ["checkpointRejected"]
    assert "bytes, its manifest says" in log[0]["problem"]


def test_unfinished_uploads_past_a_listing_page_are_all_aborted_at_start(settings: S3Storage, raw: Any) -> None:
    """A killed save of many ranks leaves more unfinished multipart uploads than one listing page
    holds (1,000): the start aborts them all, page by page, never only the first page's."""
    store = store_of(settings)
    keys = [f"{store.key}/{folder_name(10)}/w-0123456789ab/__{rank}_0.distcp" for rank in range(LIST_PAGE + 20)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda key: raw.create_multipart_upload(Bucket=settings.bucket, Key=key), keys))
    log: list[dict[str, Any]] = []
    store_of(settings, log).clean_stale()
    assert raw.list_multipart_uploads(Bucket=settings.bucket, Prefix=f"{store.key}/").get("Uploads", []) == []
    assert log == [{"event": "checkpointUploadsAborted", "count": len(keys)}]
