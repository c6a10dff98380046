"""BucketFiles: a checkpoint's files in a bucket as a source of checked copies (checkpoint.checked),
and the checks and downloads a bucket's restore makes before it reads them.

A sharded checkpoint of a bucket is read as one on a volume is (checkpoint.shards.read_local,
checkpoint.shard_copies): each object a rank reads whole (DCP's index, its rank file, the files of
its share of the checks, the shard files its plan reads) is streamed into its checked copy,
hashed on the way, never landing on a disk; a non-tensor value of another rank's share is a
ranged GET, checked against the sha256 the rank that checked its file took. One mechanism, one
place for the hash: a bucket keeps no checks of its own. A single-file checkpoint is downloaded
(`download`, `fetch_files`) and verified as the volume store does; the framework checkpoint in it, which a
framework adapter reads from a folder once the download is gone, is kept (`keep_framework`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mpjob_trainer.checkpoint import document, objects
from mpjob_trainer.checkpoint.bucket import Bucket, ObjectChanged
from mpjob_trainer.checkpoint.checked import Write
from mpjob_trainer.checkpoint.manifest import DCP, FRAMEWORK, MANIFEST, CorruptCheckpoint, Manifest, parse_manifest
from mpjob_trainer.checkpoint.peers import Peers, agreed

#: Below a bucket store's local folder: the framework checkpoint of the checkpoint it verified last.
RESTORED = ".restored"


class BucketFiles:
    """The files below `prefix` of `bucket` of the checkpoint whose manifest is in `folder`."""

    def __init__(self, bucket: Bucket, prefix: str, folder: Path) -> None:
        self.bucket, self.prefix, self.folder = bucket, prefix, folder

    def copy(self, name: str, meta: dict[str, Any], write: Write) -> None:
        where = f"{self.folder.name}: {name}"
        _download(self.bucket, f"{self.prefix}/{name}", _InOrder(write, int(meta["bytes"]), where), where)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        body = self.bucket.get_range(f"{self.prefix}/{name}", offset, length)
        if body is None or len(body) != length:
            raise CorruptCheckpoint(f"{self.folder.name}: {name} missing or shorter in the bucket than its index says")
        return body


class _InOrder:
    """A file s3transfer writes an object into in order (not seekable), handing it to `write`:
    CorruptCheckpoint once it is longer than `size` (the object changed since it was listed)."""

    def __init__(self, write: Write, size: int, where: str) -> None:
        self.out, self.left, self.where = write, size, where

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        self.left -= len(data)
        if self.left < 0:
            raise CorruptCheckpoint(f"{self.where} is longer in the bucket than its manifest says")
        self.out(data)
        return len(data)


def download(bucket: Bucket, prefix: str, folder: Path, peers: Peers) -> BucketFiles | None:
    """The manifest below `prefix` (a step's) into `folder`, and a single-file checkpoint's files; a
    sharded one's are read from the bucket as they are checked (the source returned). The ranks of
    `peers` reject it together when any one's fetch fails (a rank that went on alone, or left
    alone, would wait for the others' collectives forever)."""
    manifest = agreed(lambda: _fetch_manifest(bucket, prefix, folder), peers)
    files = objects.files_prefix(prefix, manifest)
    if manifest.layout == DCP:
        return BucketFiles(bucket, files, folder)
    agreed(lambda: fetch_files(bucket, files, folder, manifest), peers)
    return None


def _fetch_manifest(bucket: Bucket, prefix: str, folder: Path) -> Manifest:
    raw = bucket.get(f"{prefix}/{MANIFEST}", max_bytes=document.MAX_MANIFEST_BYTES)
    if raw is None:
        raise CorruptCheckpoint(f"{folder.name}: not committed (no manifest)")
    manifest = parse_manifest(raw, folder.name)  # checked: every name stays inside `folder`
    check_sizes(bucket, objects.files_prefix(prefix, manifest), folder.name, manifest)
    (folder / MANIFEST).write_bytes(raw)
    return manifest


def check_sizes(bucket: Bucket, prefix: str, name: str, manifest: Manifest) -> None:
    """CorruptCheckpoint unless every file `manifest` lists is an object below `prefix` of the size
    it gives: checked from a bounded listing before anything is downloaded."""
    found = bucket.sizes(prefix, document.MAX_FILES + 1)
    for file, meta in manifest.files.items():
        if file not in found:
            raise CorruptCheckpoint(f"{name}: {file} missing from the bucket")
        if found[file] != int(meta["bytes"]):
            raise CorruptCheckpoint(f"{name}: {file} is {found[file]} bytes, its manifest says {meta['bytes']}")


def fetch_files(bucket: Bucket, prefix: str, folder: Path, manifest: Manifest) -> None:
    """Download every file `manifest` lists from below `prefix` into `folder` (its names checked on
    reading: inside it), none past the size it gives (an object replaced since its listing);
    CorruptCheckpoint when one is missing or longer, or replaced while it was read."""
    for name, meta in manifest.files.items():
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as f:
            where = f"{folder.name}: {name}"
            _download(bucket, f"{prefix}/{name}", _InOrder(f.write, int(meta["bytes"]), where), where)


def _download(bucket: Bucket, key: str, sink: _InOrder, where: str) -> None:
    """`key` into `sink`; CorruptCheckpoint when it is missing, or replaced while it was read."""
    try:
        found = bucket.download_into(key, sink)
    except ObjectChanged:
        raise CorruptCheckpoint(f"{where} changed in the bucket while it was read") from None
    if not found:
        raise CorruptCheckpoint(f"{where} missing from the bucket")


def keep_framework(download: Path, root: Path) -> None:
    """Keep the framework checkpoint in the verified `download` of a checkpoint (none: nothing)
    below `root` (`kept_framework`), in place of the one kept before: a framework reads its
    checkpoint from a folder (resume_from_checkpoint, ckpt_path) after the download is gone. One
    at a time: what a resume, a rollback or a replay reads is what it verified just before."""
    written = download / FRAMEWORK
    if not written.is_dir():
        return
    shutil.rmtree(root / RESTORED, ignore_errors=True)
    (root / RESTORED / download.name).mkdir(parents=True)
    written.rename(kept_framework(root, download.name))


def kept_framework(root: Path, step_folder: str) -> Path:
    """Where `keep_framework` keeps the framework checkpoint of the checkpoint `step_folder`."""
    return root / RESTORED / step_folder / FRAMEWORK
