"""A commit's put where no object is (checkpoint.put_if_absent), on servers that honour the
condition, answer NotImplemented, or ignore it: the probe tells them apart once per store, leaves
nothing behind, and on the last two a key that holds an object is never put over."""

from __future__ import annotations

import pytest

from mpjob_trainer.checkpoint.put_if_absent import PROBES, Condition, PutIfAbsent
from tests.unit.trainer.memory_bucket import MemoryBucket

pytestmark = pytest.mark.unit


class IgnoringBucket(MemoryBucket):
    """A server that ignores If-None-Match: every conditional put lands."""

    def create(self, key: str, body: bytes) -> bool | None:
        self.put(key, body)
        return True


class UnimplementedBucket(MemoryBucket):
    """A server that answers a conditional put with NotImplemented (501)."""

    def create(self, key: str, body: bytes) -> bool | None:
        return None


def put_if_absent(bucket: MemoryBucket) -> tuple[PutIfAbsent, list[dict[str, str]]]:
    told: list[dict[str, str]] = []
    return PutIfAbsent(bucket, "runs/ns/job/uid", lambda event, **fields: told.append({"event": event, **fields})), told


@pytest.mark.parametrize(
    ("bucket", "condition"),
    [(MemoryBucket, Condition.HONOURED), (IgnoringBucket, Condition.IGNORED), (UnimplementedBucket, None)],
)
def test_a_key_that_holds_an_object_is_never_put_over(bucket: type[MemoryBucket], condition: Condition | None) -> None:
    store = bucket()
    put, told = put_if_absent(store)
    assert put("runs/ns/job/uid/step-000000010/manifest.json", b"first")
    assert not put("runs/ns/job/uid/step-000000010/manifest.json", b"second")
    assert store.objects == {"runs/ns/job/uid/step-000000010/manifest.json": b"first"}
    assert not any(f"/{PROBES}/" in key for key in store.objects)
    learnt = Condition.NOT_IMPLEMENTED if condition is None else condition
    assert put.condition is learnt
    assert told == ([] if learnt is Condition.HONOURED else [
        {"event": "checkpointPutUnconditional", "bucket": "ckpt", "condition": str(learnt)}
    ])  # fmt: skip


def test_the_server_is_probed_once_per_store() -> None:
    store = IgnoringBucket()
    put, told = put_if_absent(store)
    for step in (10, 20, 30):
        assert put(f"runs/ns/job/uid/step-{step:09d}/manifest.json", b"m")
    probes = [key for key in store.deleted if f"/{PROBES}/" in key]
    assert len(probes) == 1 and probes[0].startswith("runs/ns/job/uid/") and len(told) == 1


def test_a_server_that_stops_implementing_the_condition_is_told_and_looked_at() -> None:
    """A bucket behind a proxy that answered the probe but refuses a later condition (501)."""
    store = MemoryBucket()
    put, told = put_if_absent(store)
    assert put("runs/a/manifest.json", b"a") and put.condition is Condition.HONOURED
    store.objects["runs/b/manifest.json"] = b"theirs"
    store.create = lambda key, body: None  # type: ignore[method-assign]
    assert not put("runs/b/manifest.json", b"mine") and store.objects["runs/b/manifest.json"] == b"theirs"
    assert put("runs/c/manifest.json", b"c") and put.condition is Condition.NOT_IMPLEMENTED
    assert [entry["condition"] for entry in told] == ["notImplemented"]


class KeepingBucket(MemoryBucket):
    """A server that fails every delete."""

    def delete(self, keys: list[str]) -> None:
        raise OSError("delete refused")


def test_a_probe_object_the_bucket_keeps_is_told_and_the_put_goes_on() -> None:
    store = KeepingBucket()
    put, told = put_if_absent(store)
    assert put("runs/ns/job/uid/step-000000010/manifest.json", b"m") and put.condition is Condition.HONOURED
    (left,) = told
    assert left["event"] == "checkpointUploadsLeft" and left["prefix"].startswith(f"runs/ns/job/uid/{PROBES}/")
    assert "delete refused" in left["problem"]
