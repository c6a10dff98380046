"""keep-K's prune against a real S3 server (the test cluster's versitygw): a checkpoint's files go
before its manifest, so a prune the server cuts midway (a delete it refuses) leaves a committed
checkpoint the next save's prune finishes, the save that pruned counting all the same, and no
step folder is left that nothing prunes."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.cluster.layout import Layout
from tests.cluster.s3 import data_dir
from tests.integration.storage.test_s3_store import key, state, store_of

pytestmark = pytest.mark.integration


@contextmanager
def undeletable(path: Path) -> Iterator[None]:
    """The server's object file `path` made one its filesystem refuses to unlink (the immutable
    flag: root is refused too), until the block ends; skipped where the flag cannot be set."""
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("the server's filesystem takes no immutable flag (chattr): no delete can be refused")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def framework(store: BucketCheckpointStore, step: int) -> Path:
    """A folder of three files for the save to adopt: a checkpoint whose prune has deletes to cut."""
    written = store.staging(f".tmp-framework-{step:09d}") / "checkpoint"
    (written / "nested").mkdir(parents=True)
    for name in ("a.bin", "nested/b.bin", "z.bin"):
        (written / name).write_bytes(bytes([step]) * 100)
    return written


def steps_listed(raw: Any, settings: S3Storage, store: BucketCheckpointStore) -> set[str]:
    """The step folders that hold any object below the job's prefix, as the server lists them."""
    listed = raw.list_objects_v2(Bucket=settings.bucket, Prefix=f"{store.key}/")
    keys = [item["Key"].removeprefix(f"{store.key}/") for item in listed.get("Contents", [])]
    return {k.split("/")[0] for k in keys if k.startswith("step-")}


def test_a_prune_the_server_cuts_midway_is_finished_by_the_next_save(settings: S3Storage, raw: Any) -> None:
    store = store_of(settings, keep=1)
    store.write(10, "fp32", state(10), adopt=framework(store, 10))
    names = list(
        json.loads(raw.get_object(Bucket=settings.bucket, Key=key(store, 10, MANIFEST))["Body"].read())["files"]
    )
    keys = [key(store, 10, name) for name in names]
    refused = keys[-1]  # the manifest's last file: the deletes before it are done, the manifest's after it not
    with undeletable(data_dir(Layout.from_env()) / settings.bucket / refused):
        saved = store.write(20, "fp32", state(20), adopt=framework(store, 20))
    assert saved.ref.step == 20 and saved.housekeeping is not None and "not pruned" in saved.housekeeping
    said = saved.housekeeping
    assert "failed to delete" in said and refused.rsplit("/", 2)[-2] in said and said.endswith(")"), said
    present = {k: raw.list_objects_v2(Bucket=settings.bucket, Prefix=k).get("KeyCount", 0) > 0 for k in keys}
    assert present == {**{k: False for k in keys[:-1]}, refused: True}, "cut midway: the files before it went"
    assert [s for s, _ in store.steps()] == [10, 20] and store.manifest(store.url(10)) is not None
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 20  # the committed save counts

    assert store.write(30, "fp32", state(30), adopt=framework(store, 30)).housekeeping is None
    assert [s for s, _ in store.steps()] == [30]
    assert steps_listed(raw, settings, store) == {folder_name(30)}  # no step folder left that nothing prunes
