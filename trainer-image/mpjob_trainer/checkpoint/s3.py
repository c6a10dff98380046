"""BucketCheckpointStore: a job's checkpoints in an S3-compatible bucket, with the guarantees of
the volume store (checkpoint.store) and the same public surface, so the Checkpointer drives
either.

Layout: `s3://<bucket>/<prefix>/<namespace>/<job>/<uid>/step-000000200/` holds the files of one
checkpoint (checkpoint.manifest's format, unchanged) and its `manifest.json`. A checkpoint is
written by the volume store into a private local spool folder (torch.save, sha256 of every
file, the manifest), then uploaded file by file (multipart, parts in parallel: bucket.Bucket)
and the manifest uploaded LAST: an object store has no rename, so the manifest is the commit
marker. Until it exists the folder is not a checkpoint; readers list only folders with a
manifest, and a save killed at any moment leaves objects no reader considers (the next save of
that step writes them again; `clean_stale` aborts its unfinished multipart uploads).

The store implements checkpoint.protocol's Store over the bucket (`steps`, `named`,
`manifest`, `verify`, `set_aside`, `discard`); resume order, ownership, a save's check of its
step and keep-K pruning are the volume store's, written once (checkpoint.resume,
checkpoint.ownership). A manifest in the bucket is read as untrusted input
(checkpoint.document) before anything it names is downloaded or deleted: one that is malformed
or names a file outside its folder (absolute, `..`, a backslash) is corrupt, never followed,
never pruned, never replaced (a save of its step writes nothing: CheckpointTaken).
Loading checks every listed object's size, downloads them and verifies the folder as the volume
store does: a deleted, damaged or missing object rejects it for the previous good one.
Pruning keeps this job's newest `keep` committed checkpoints; an older one is uncommitted first
(manifest deleted), then only the objects its manifest lists go: nothing another wrote.
Writes happen on the writer thread; a failure no retry can fix names the bucket (BucketMisconfigured).

Sharded (layout dcp, checkpoint.sharded): each rank spools its own DCP files and uploads them
(`publish`) after rank 0 checked the step's place (`taken`); rank 0 puts the manifest once all
agreed (`commit`). A restore fetches on each rank only what that rank reads, each file checked
as it lands, and the ranks agree before any of them uses it (checkpoint.fetched).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path, PurePosixPath
from typing import Any

from mpjob_contract.report import CheckpointRef
from mpjob_contract.storage import S3Storage, split_url
from mpjob_trainer.checkpoint import document, ownership
from mpjob_trainer.checkpoint.bucket import Bucket, open_bucket
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.fetched import FetchedCheckpoint, open_sharded
from mpjob_trainer.checkpoint.manifest import (
    DCP,
    MANIFEST,
    CorruptCheckpoint,
    Manifest,
    folder_name,
    parse_manifest,
    read_manifest,
    step_of,
)
from mpjob_trainer.checkpoint.protocol import Log
from mpjob_trainer.checkpoint.shards import Peers, agreed
from mpjob_trainer.checkpoint.store import CheckpointStore, SaveResult
from mpjob_trainer.checkpoint.transfer import PrivateTransferMetrics, TransferMetrics

#: The step folders one listing of the job's prefix reads (LIST_PAGE a request): with keep-K
#: pruning a job holds a few; a prefix crowded past this is read no further (logged).
MAX_FOLDERS = 10_000


class BucketCheckpointStore:
    def __init__(
        self,
        location: str,
        settings: S3Storage,
        *,
        keep: int,
        config_digest: str,
        job: str,
        log: Log | None = None,
        metrics: TransferMetrics | None = None,
        bucket: Bucket | None = None,
    ) -> None:
        name, self.key = split_url(location)
        if name != settings.bucket:
            raise ValueError(f"{location!r} is not in bucket {settings.bucket!r}")
        self.location = location.rstrip("/")
        self.keep = keep
        self.job = job
        self.log: Log = log or (lambda *a, **k: None)
        self.metrics: TransferMetrics = metrics or PrivateTransferMetrics()
        self.bucket = bucket or open_bucket(settings)
        #: Where checkpoints are written before upload and downloaded before loading (the
        #: volume store's own rules apply there); a framework stages into it too.
        self.root = Path(tempfile.mkdtemp(prefix="mpjob-checkpoints-"))
        weakref.finalize(self, shutil.rmtree, self.root, True)
        self.local = CheckpointStore(self.root, keep, config_digest, self.log, job=job)
        self.unloadable: set[str] = set()
        self._writing = threading.Lock()
        #: The sharded checkpoint a restore reads its shards from (checkpoint.shards.restore_shards).
        self._restoring: FetchedCheckpoint | None = None

    @property
    def config_digest(self) -> str:
        return self.local.config_digest

    def url(self, step: int) -> str:
        return f"{self.location}/{folder_name(step)}"

    # -- what is committed ------------------------------------------------------------------
    def steps(self) -> list[tuple[int, str]]:
        """The step folders below the job's prefix, oldest first (committed or not): the first
        MAX_FOLDERS the listing gives (a bounded number of requests; more are logged, not read)."""
        names = self.bucket.folders(self.key, MAX_FOLDERS)
        if len(names) >= MAX_FOLDERS:
            self.log("checkpointListingCapped", prefix=self.key, listed=len(names))
        return sorted({(step, self.url(step)) for name in names if (step := step_of(name)) is not None})

    def named(self, prefer: str) -> str | None:
        """This job's place of the step `prefer` names (None: it names no step)."""
        step = step_of(PurePosixPath(prefer).name)
        return self.url(step) if step is not None else None

    def manifest(self, where: str) -> Manifest | None:
        """The committed manifest at `where` (None: not committed; CorruptCheckpoint: not valid)."""
        name = PurePosixPath(where).name
        raw = self._manifest_bytes(f"{self.key}/{name}")
        return parse_manifest(raw, name) if raw is not None else None

    def set_aside(self, where: str) -> None:
        """Uncommit the damaged checkpoint at `where` (its manifest deleted)."""
        self.bucket.delete([f"{self._prefix(where)}/{MANIFEST}"])

    def discard(self, where: str, manifest: Manifest) -> None:
        """Uncommit the checkpoint at `where`, then delete the objects its manifest lists."""
        prefix = self._prefix(where)
        self.bucket.delete([f"{prefix}/{MANIFEST}"])
        self.bucket.delete([f"{prefix}/{name}" for name in manifest.files])  # names checked on reading

    def _prefix(self, where: str) -> str:
        return f"{self.key}/{PurePosixPath(where).name}"

    def _manifest_bytes(self, prefix: str) -> bytes | None:
        """The manifest object below `prefix`, read no further than a manifest may go."""
        return self.bucket.get(f"{prefix}/{MANIFEST}", max_bytes=MAX_MANIFEST_BYTES)

    def clean_stale(self) -> None:
        """Abort the multipart uploads of saves that were killed midway (below this job's prefix)."""
        aborted = self.bucket.abort_uploads(self.key)
        if aborted:
            self.log("checkpointUploadsAborted", count=aborted)

    def staging(self, name: str) -> Path:
        return self.local.staging(name)

    # -- reading ----------------------------------------------------------------------------
    def verify(self, path: Path | str, *, alone: bool = False) -> tuple[CheckpointRef, dict[str, Any]]:
        """Download the checkpoint named by `path` (its last segment is the step folder) and
        verify it as the volume store does; the ref names its place in the bucket. A sharded
        checkpoint's folder stays until the next restore: its shards are fetched into it and read."""
        name = PurePosixPath(str(path)).name
        step = step_of(name)
        if step is None:
            raise CorruptCheckpoint(f"{path}: not a checkpoint folder")
        start = time.perf_counter()
        folder = Path(tempfile.mkdtemp(prefix=".download-", dir=self.root)) / name
        folder.mkdir()
        fetched = None
        try:
            fetched = self._download(step, folder, alone=alone)
            ref, state = self.local.verify(folder, alone=alone)
        except BaseException:
            if fetched is not None:
                fetched.forget()
            shutil.rmtree(folder.parent, ignore_errors=True)
            raise
        if fetched is None:
            shutil.rmtree(folder.parent, ignore_errors=True)
        else:  # the previous restore has read its shards: only this one's stay
            previous, self._restoring = self._restoring, fetched
            if previous is not None:
                previous.forget()
                shutil.rmtree(previous.folder.parent, ignore_errors=True)
        self.metrics.checkpoint_restore_seconds.observe(time.perf_counter() - start)
        return ref.model_copy(update={"path": self.url(step)}), state

    def _download(self, step: int, folder: Path, *, alone: bool) -> FetchedCheckpoint | None:
        """The manifest's files into `folder`; a sharded checkpoint restored by the ranks together
        only what each one's verification reads (checkpoint.fetched: the rest as it is read). The
        ranks reject it together when any one's fetch fails (a rank that went on alone, or left
        alone, would wait for the others' collectives forever)."""
        prefix = f"{self.key}/{folder.name}"
        peers = Peers(0, 1) if alone else Peers.current()
        manifest = agreed(lambda: self._fetch_manifest(prefix, folder), peers)
        if manifest.layout == DCP and not alone:
            return open_sharded(self.bucket, prefix, folder, manifest)
        agreed(lambda: self._fetch_files(prefix, folder, manifest), peers)
        return None

    def _fetch_files(self, prefix: str, folder: Path, manifest: Manifest) -> None:
        for name in manifest.files:
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if not self.bucket.download(f"{prefix}/{name}", target):
                raise CorruptCheckpoint(f"{folder.name}: {name} missing from the bucket")

    def _fetch_manifest(self, prefix: str, folder: Path) -> Manifest:
        raw = self._manifest_bytes(prefix)
        if raw is None:
            raise CorruptCheckpoint(f"{folder.name}: not committed (no manifest)")
        manifest = parse_manifest(raw, folder.name)  # checked: every name stays inside `folder`
        self._check_sizes(prefix, folder.name, {name: int(meta["bytes"]) for name, meta in manifest.files.items()})
        (folder / MANIFEST).write_bytes(raw)
        return manifest

    def _check_sizes(self, prefix: str, name: str, expected: dict[str, int]) -> None:
        """CorruptCheckpoint unless every file the manifest lists is an object of the size it
        gives: checked from a bounded listing before anything is downloaded."""
        found = self.bucket.sizes(prefix, document.MAX_FILES + 1)
        for file, size in expected.items():
            if file not in found:
                raise CorruptCheckpoint(f"{name}: {file} missing from the bucket")
            if found[file] != size:
                raise CorruptCheckpoint(f"{name}: {file} is {found[file]} bytes, its manifest says {size}")

    # -- writing ----------------------------------------------------------------------------
    def write(self, step: int, precision: str, state: dict[str, Any], *, adopt: Path | None = None) -> SaveResult:
        """Write `state` as `step`'s checkpoint: files first, the manifest last (the commit)."""
        with self._writing:
            start = time.perf_counter()
            kept = ownership.occupied(self, self.url(step))
            if kept is not None:
                return SaveResult(kept, time.perf_counter() - start, 0)
            spooled = self.local.write(step, precision, state, adopt=adopt)
            folder = Path(spooled.ref.path)
            try:
                uploaded = self._upload(folder, step)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            ownership.prune(self, step)
            ref = spooled.ref.model_copy(update={"path": self.url(step)})
            return SaveResult(ref, time.perf_counter() - start, uploaded)

    def _upload(self, folder: Path, step: int) -> int:
        size = self.publish(step, folder, read_manifest(folder).files)
        self._put_manifest(step, (folder / MANIFEST).read_bytes())  # the commit: last, and only now
        return size

    def taken(self, step: int) -> CheckpointRef | None:
        """What a sharded save finds at `step`'s place before its ranks upload (as `write`
        checks: this job's valid checkpoint is kept; CheckpointTaken when it must write nothing)."""
        return ownership.occupied(self, self.url(step))

    def publish(self, step: int, folder: Path, files: dict[str, dict[str, Any]]) -> int:
        """Upload `files` (names relative to `folder`) below `step`'s prefix: not yet a
        checkpoint; the manifest, put last, makes one. Returns their bytes."""
        prefix = f"{self.key}/{folder_name(step)}"
        start, size = time.perf_counter(), 0
        try:
            for name, meta in files.items():
                self.bucket.upload(f"{prefix}/{name}", folder / name)
                size += int(meta["bytes"])
        except Exception:
            self.metrics.checkpoint_commit_failures.inc()
            raise
        self.metrics.checkpoint_upload_seconds.observe(time.perf_counter() - start)
        self.metrics.checkpoint_upload_bytes.inc(size)
        return size

    def commit(
        self, tmp: Path, step: int, precision: str, files: dict[str, dict[str, Any]], *, world_size: int
    ) -> SaveResult:
        """Rank 0, once every rank has published its files of a sharded save (`files`: each
        one's sha256 and size): the manifest, the commit, then keep-K."""
        start = time.perf_counter()
        manifest = self.local.sharded_manifest(step, precision, files, world_size=world_size)
        shutil.rmtree(tmp, ignore_errors=True)
        with self._writing:
            self._put_manifest(step, json.dumps(manifest.to_json()).encode())
            ownership.prune(self, step)
        ref = CheckpointRef(step=step, path=self.url(step), sha256=manifest.state_sha256, precision=precision)
        return SaveResult(ref, time.perf_counter() - start, sum(int(meta["bytes"]) for meta in files.values()))

    def _put_manifest(self, step: int, body: bytes) -> None:
        try:
            self.bucket.put(f"{self.key}/{folder_name(step)}/{MANIFEST}", body)
        except Exception:
            self.metrics.checkpoint_commit_failures.inc()
            raise
        self.metrics.checkpoint_upload_bytes.inc(len(body))
