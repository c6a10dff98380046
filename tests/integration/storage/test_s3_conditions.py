"""A bucket whose server does not honour a conditional put, against a real S3 server (the test
cluster's versitygw, its puts' If-None-Match header dropped on the way, as an older S3-compatible
server ignores it): the store finds out with a probe of its own, says so once, leaves no probe
object behind, and a manifest that landed during this save's upload is still never replaced."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.manifest import STATE, folder_name
from mpjob_trainer.checkpoint.put_if_absent import PROBES, Condition
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.integration.storage.test_s3_writers import keys, state, store_of

pytestmark = pytest.mark.integration


def drop_the_condition(request: Any, **_: Any) -> None:
    """What a server that ignores If-None-Match sees of a conditional put: a plain one."""
    del request.headers["If-None-Match"]


def ignoring(store: BucketCheckpointStore) -> BucketCheckpointStore:
    store.bucket.client.meta.events.register("before-sign.s3.PutObject", drop_the_condition)
    return store


def test_a_server_that_ignores_the_condition_is_found_out_and_told_once(settings: S3Storage, raw: Any) -> None:
    log: list[dict[str, Any]] = []
    store = ignoring(store_of(settings, log))
    store.write(10, "bf16", state(10, 1.0))
    store.write(20, "bf16", state(20, 2.0))
    assert store.put_if_absent.condition is Condition.IGNORED
    told = [entry for entry in log if entry["event"] == "checkpointPutUnconditional"]
    assert told == [{"event": "checkpointPutUnconditional", "bucket": settings.bucket, "condition": "ignored"}]
    assert not any(f"/{PROBES}/" in key for key in keys(raw, settings, settings.prefix))
    honest: list[dict[str, Any]] = []
    other = store_of(settings, honest)
    other.write(30, "bf16", state(30, 3.0))
    assert other.put_if_absent.condition is Condition.HONOURED and honest == []


def test_a_checkpoint_that_landed_during_the_upload_stays_on_such_a_server(settings: S3Storage, raw: Any) -> None:
    """Writer B saves step 20 whole while writer A, on a server that ignores the condition, uploads
    its files: A's commit finds B's manifest there, keeps it and reports it; A's files go."""
    first, second = ignoring(store_of(settings)), store_of(settings)
    first.write(10, "bf16", state(10, 1.0))
    raced: list[Any] = []

    def the_other_saves_during_the_upload(params: dict[str, Any], **_: Any) -> None:
        key = params.get("Key", "")
        if key.endswith(f"/{STATE}") and f"/{folder_name(20)}/" in key and not raced:
            raced.append(second.write(20, "bf16", state(20, 3.0)).ref)

    first.bucket.client.meta.events.register("before-parameter-build.s3.PutObject", the_other_saves_during_the_upload)
    reported = first.write(20, "bf16", state(20, 2.0)).ref
    assert raced and reported == raced[0]
    loaded = resume.load(store_of(settings))
    assert loaded is not None and loaded[0] == raced[0] and torch.equal(loaded[1]["w"], state(20, 3.0)["w"])
