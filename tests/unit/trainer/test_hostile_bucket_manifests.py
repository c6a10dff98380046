"""The bucket store reads a manifest in the bucket as untrusted input, before it downloads or
deletes anything it names: a file name that would leave the checkpoint's folder (absolute, `..`,
a backslash) or a malformed manifest makes that checkpoint corrupt, and the previous good one is
used; nothing is written outside the local spool and nothing outside the step's prefix deleted.
The bucket is an in-memory one with the store's own Bucket surface (memory_bucket)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.environment import SCRATCH_ENV
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name
from mpjob_trainer.checkpoint.put_if_absent import PROBES
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"


def _store(bucket: MemoryBucket, log: list[dict[str, Any]] | None = None, keep: int = 5) -> BucketCheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    location = f"{SETTINGS.url}/ns/job/uid"
    return BucketCheckpointStore(location, SETTINGS, keep=keep, config_digest="d1", job=JOB, log=record, bucket=bucket)


def _saved(*steps: int) -> tuple[MemoryBucket, BucketCheckpointStore]:
    bucket = MemoryBucket()
    store = _store(bucket)
    for step in steps:
        store.write(step, "bf16", {"step": step, "w": torch.ones(4) * step})
    return bucket, store


def _manifest_key(store: BucketCheckpointStore, step: int) -> str:
    return f"{store.key}/{folder_name(step)}/{MANIFEST}"


def _plant(bucket: MemoryBucket, store: BucketCheckpointStore, step: int, names: list[str]) -> None:
    """Rewrite `step`'s manifest to list `names` too, each an object of the bucket as named."""
    key = _manifest_key(store, step)
    manifest = json.loads(bucket.objects[key])
    for name in names:
        manifest["files"][name] = {"sha256": "0" * 64, "bytes": 7}
        bucket.objects[f"{store.key}/{folder_name(step)}/{name}"] = b"planted"
    bucket.objects[key] = json.dumps(manifest).encode()


def _escaping_names(tmp_path: Path) -> list[list[str]]:
    return [
        ["../../../../../../../../" + str(tmp_path / "dotdot").lstrip("/")],
        [str(tmp_path / "absolute")],
        ["framework/../../escaped"],
        ["framework\\..\\..\\escaped"],
    ]


@pytest.mark.parametrize("case", range(4), ids=["dotdot", "absolute", "inner-dotdot", "backslash"])
def test_a_manifest_naming_files_outside_its_folder_writes_nothing_and_the_previous_one_is_used(
    tmp_path: Path, case: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    spools = tmp_path / "spools"  # the stores' local spools, where a restore may write
    spools.mkdir()
    monkeypatch.setenv(SCRATCH_ENV, str(spools))
    names = _escaping_names(tmp_path)[case]
    bucket, store = _saved(10, 20)
    _plant(bucket, store, 20, names)
    log: list[dict[str, Any]] = []
    reader = _store(bucket, log)
    loaded = resume.load(reader)
    assert not (tmp_path / "dotdot").exists() and not (tmp_path / "absolute").exists()
    assert reader.root.parent == spools and list(tmp_path.rglob("*escaped*")) == []
    assert loaded is not None and loaded[0].step == 10
    assert [e["event"] for e in log] == ["checkpointRejected"] and "unreadable manifest" in log[0]["problem"]


def test_pruning_deletes_only_below_each_checkpoints_own_prefix(tmp_path: Path) -> None:
    bucket, store = _saved(10)
    _plant(bucket, store, 10, ["../../../other-job/step-000000010/state.pt", "/other-bucket-root/state.pt"])
    store = _store(bucket, keep=1)
    for step in (20, 30):
        store.write(step, "bf16", {"step": step, "w": torch.zeros(4)})
    pruned = [key for key in bucket.deleted if not key.startswith(f"{store.key}/{PROBES}/")]  # a store's own probe
    assert pruned and all(key.startswith(f"{store.key}/step-") and ".." not in key for key in pruned), bucket.deleted
    assert _manifest_key(store, 10) in bucket.objects  # not provably its own: left as it is
    assert [s for s, _ in store.steps()] == [10, 30]


@pytest.mark.parametrize("body", [b"[" * 100_000 + b"]" * 100_000, b'{"files": {"a": "b"}}', b"\xff" * 64])
def test_a_malformed_manifest_in_the_bucket_is_a_corrupt_checkpoint(body: bytes) -> None:
    bucket, store = _saved(10, 20, 30)
    bucket.objects[_manifest_key(store, 30)] = body
    bucket.objects[_manifest_key(store, 20)] = body
    log: list[dict[str, Any]] = []
    reader = _store(bucket, log, keep=2)
    loaded = resume.load(reader, prefer=f"{store.location}/{folder_name(30)}", newer_in="bf16")
    assert loaded is not None and loaded[0].step == 10
    assert [e["event"] for e in log] == ["checkpointRejected"] * 2
    reader.write(40, "bf16", {"step": 40, "w": torch.zeros(4)})
    assert bucket.objects[_manifest_key(store, 20)] == body  # neither pruned nor rewritten


@pytest.mark.parametrize("odd", ["step-000000020\n", "step-" + "\uff10" * 7 + "\uff12\uff10", "step-000000020 "])
def test_a_folder_whose_name_only_looks_like_a_kept_step_is_no_checkpoint_and_prunes_nothing(odd: str) -> None:
    bucket, store = _saved(10, 20)
    bucket.objects[f"{store.key}/{odd}/{MANIFEST}"] = bucket.objects[_manifest_key(store, 20)]
    store = _store(bucket, keep=2)
    assert [s for s, _ in store.steps()] == [10, 20]
    store.write(30, "bf16", {"step": 30, "w": torch.zeros(4)})
    assert [s for s, _ in store.steps()] == [20, 30]  # keep=2: the newest two, step 20 among them
    assert _manifest_key(store, 20) in bucket.objects


def test_a_name_no_local_folder_can_hold_is_a_corrupt_checkpoint_and_the_previous_one_is_used() -> None:
    """A bucket's key may hold a segment past the 255 bytes a file's name may have (200 `é` are 400
    bytes, within the 255 characters a manifest's segment had): downloading it into the local spool
    raised OSError (file name too long), which ended the resume instead of passing it over."""
    name = "framework/" + "é" * 200
    bucket, store = _saved(10, 20)
    key = _manifest_key(store, 20)
    manifest = json.loads(bucket.objects[key])
    manifest["files"][name] = {"sha256": hashlib.sha256(b"planted").hexdigest(), "bytes": 7}
    bucket.objects[f"{store.key}/{folder_name(20)}/{manifest['writer']}/{name}"] = b"planted"
    bucket.objects[key] = json.dumps(manifest).encode()
    log: list[dict[str, Any]] = []
    loaded = resume.load(_store(bucket, log))
    assert loaded is not None and loaded[0].step == 10
    assert [e["event"] for e in log] == ["checkpointRejected"] and "unreadable manifest" in log[0]["problem"], log
