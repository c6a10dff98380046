"""BucketCheckpointStore: a job's checkpoints in an S3-compatible bucket, with the guarantees and the
public surface of the volume store (checkpoint.store), so the Checkpointer drives either.

Layout (checkpoint.objects): `s3://<bucket>/<prefix>/<namespace>/<job>/<uid>/step-000000200/` holds
one checkpoint's manifest and, in a folder of its writer's own, its files (checkpoint.manifest's
format). A save writes through the volume store into a private local spool folder (torch.save,
sha256 of every file, the manifest), uploads file by file (multipart, parts in parallel:
bucket.Bucket), then the manifest naming the writer's folder, LAST: an object store has no rename,
so the manifest is the commit. A folder without one is no checkpoint; two writers of one step share
no key, and the manifest is put only where none is: a committed checkpoint is never replaced
(checkpoint.bucket_commit). A save that fails
deletes what it uploaded (`withdraw`; after a failed put of its manifest, only when that did not
land); a killed one's go with a later prune (`clear`: checkpoint.leftovers says when); `clean_stale`
aborts unfinished multipart uploads. It implements checkpoint.protocol's Store over the bucket:
resume order, ownership, a save's check of its step, keep-K, the bound on set-aside checkpoints
(their manifests moved below `.corrupt/`) and the marks of those that did not load (below
`.unloadable/`) are the volume store's (checkpoint.resume, .ownership, .unloadable). A manifest is
untrusted input (checkpoint.document): a malformed one, or one naming a file outside its folder, is
corrupt, never followed, pruned or replaced. Loading checks every listed object's size, downloads
and verifies as the volume store does; a pruned checkpoint loses the objects its manifest lists,
then the manifest (a prune cut midway is redone by the next). The manifest's put is the commit
point: nothing after it (keep-K: ownership.tidy) unwrites the checkpoint. A failure no retry can fix
names the bucket (BucketMisconfigured).

Sharded (checkpoint.sharded): after rank 0 checked the step's place (`taken`) each rank uploads
its own files (`publish`), rank 0 puts the manifest once all agreed (`commit`) or else deletes
them (`withdraw`). A restore reads on each rank only what it reads of a volume's, straight from
the bucket into the copies it checks (checkpoint.bucket_files). A framework's save on several
ranks does the same with the files other ranks write (checkpoint.rank_files: `write(joined=)`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from mpjob_contract.report import CheckpointRef
from mpjob_contract.storage import S3Storage, split_url
from mpjob_trainer.checkpoint import bucket_commit, leftovers, objects, ownership
from mpjob_trainer.checkpoint.bucket import Bucket, open_bucket
from mpjob_trainer.checkpoint.bucket_files import download, keep_framework, kept_framework
from mpjob_trainer.checkpoint.bucket_marks import BucketMarks
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.lineage import UNJUDGED, Lineage
from mpjob_trainer.checkpoint.manifest import (
    MANIFEST,
    CorruptCheckpoint,
    Manifest,
    folder_name,
    parse_manifest,
    read_manifest,
    step_of,
)
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.protocol import Log
from mpjob_trainer.checkpoint.put_if_absent import PutIfAbsent
from mpjob_trainer.checkpoint.store import CheckpointStore, SaveResult
from mpjob_trainer.checkpoint.transfer import PrivateTransferMetrics, TransferMetrics
from mpjob_trainer.checkpoint.unloadable import MARK_BYTES
from mpjob_trainer.spool import Spool

#: The step folders one listing of the job's prefix reads (LIST_PAGE a request): with keep-K
#: pruning a job holds a few; a prefix crowded past this is read no further (logged).
MAX_FOLDERS = 10_000


class BucketCheckpointStore:
    def __init__(
        self, location: str, settings: S3Storage, *, keep: int, config_digest: str, job: str, log: Log | None = None,
        metrics: TransferMetrics | None = None, bucket: Bucket | None = None, build: str = "",
        lineage: Lineage = UNJUDGED,
    ) -> None:  # fmt: skip
        name, self.key = split_url(location)
        if name != settings.bucket:
            raise ValueError(f"{location!r} is not in bucket {settings.bucket!r}")
        self.location = location.rstrip("/")
        self.log: Log = log or (lambda *a, **k: None)
        self.metrics: TransferMetrics = metrics or PrivateTransferMetrics()
        self.bucket = bucket or open_bucket(settings)
        #: Where checkpoints are written before upload and downloaded before loading (the
        #: volume store's own rules apply there); a framework stages into it, and resumes from it.
        #: On the pod's scratch disk, removed with this store; a killed trainer's, by the next one's.
        self.spool = Spool("mpjob-checkpoints-")
        self.root = self.spool.path
        self.local = CheckpointStore(self.root, keep, config_digest, self.log, job=job, build=build, lineage=lineage)
        self.keep, self.job, self.build, self.lineage = keep, job, self.local.build, lineage
        self.unloadable: set[str] = set()
        self.marks = BucketMarks(self.bucket, self.key, MARK_BYTES)
        #: How a commit puts its manifest only where none is (checkpoint.bucket_commit).
        self.put_if_absent = PutIfAbsent(self.bucket, self.key, self.log)
        self._writing = threading.Lock()

    @property
    def config_digest(self) -> str:
        return self.local.config_digest

    def url(self, step: int) -> str:
        return f"{self.location}/{folder_name(step)}"

    def _step_prefix(self, step: int) -> str:
        return f"{self.key}/{folder_name(step)}"

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
        place = objects.place_prefix(self.key, where)
        raw = self._manifest_bytes(place)
        return parse_manifest(raw, PurePosixPath(place).name) if raw is not None else None

    def set_aside(self, where: str) -> None:
        """Uncommit the damaged checkpoint at `where`, its manifest moved below `.corrupt/` (its objects
        stay where they are); of those set aside the newest CORRUPT_KEPT stay (ownership.bound_aside)."""
        place = objects.place_prefix(self.key, where)
        raw, step = self._manifest_bytes(place), step_of(PurePosixPath(place).name)
        if raw is not None and step is not None:
            self.bucket.put(f"{self.key}/{objects.ASIDE}/{objects.aside_name(step)}/{MANIFEST}", raw)
        self.bucket.delete([f"{place}/{MANIFEST}"])
        ownership.bound_aside(self)

    def aside(self) -> list[str]:
        """The set-aside checkpoints below `.corrupt/` (the first MAX_FOLDERS listed), oldest first."""
        names = sorted(self.bucket.folders(f"{self.key}/{objects.ASIDE}", MAX_FOLDERS))
        return [f"{self.location}/{objects.ASIDE}/{name}" for name in names if objects.aside_step(name) is not None]

    def mark_unloadable(self, where: str, mark: str | None) -> None:
        """The object `.unloadable/<step folder>` below the job's prefix, holding `mark` (None: deleted)."""
        self.marks.write(where, mark)

    def unloadable_mark(self, where: str) -> bytes | None:
        """The mark of `where`, read no further than a mark may go (unloadable.MARK_BYTES)."""
        return self.marks.read(where)

    def discard(self, where: str, manifest: Manifest) -> None:
        """The objects a checkpoint's manifest lists (one set aside: those the step's committed one does
        not), then the manifest: a prune cut midway leaves it naming what is left, for the next prune."""
        place = objects.place_prefix(self.key, where)
        step = objects.aside_step(PurePosixPath(place).name)
        if step is None:
            self.bucket.delete([*objects.file_keys(place, manifest), f"{place}/{MANIFEST}"])
            return
        try:
            unshared = objects.unshared(self._step_prefix(step), manifest, self.manifest(self.url(step)))
        except CorruptCheckpoint:  # what the step's unreadable one (a newer trainer's?) names cannot be known
            unshared = []
        self.bucket.delete([*unshared, f"{place}/{MANIFEST}"])  # its own last: a prune killed midway is redone

    def clear(self, wheres: list[str]) -> None:
        """What saves that never committed left in one of the step folders `wheres` (leftovers.clear)."""
        leftovers.clear(self, wheres)

    def _manifest_bytes(self, prefix: str) -> bytes | None:
        """The manifest object below `prefix`, read no further than a manifest may go."""
        return self.bucket.get(f"{prefix}/{MANIFEST}", max_bytes=MAX_MANIFEST_BYTES)

    def clean_stale(self) -> None:
        """Abort the multipart uploads of saves that were killed midway (checkpoint.leftovers.abort)."""
        leftovers.abort(self.bucket, self.log, self.key)

    def staging(self, name: str) -> Path:
        return self.local.staging(name)

    # -- reading ----------------------------------------------------------------------------
    def verify(self, path: Path | str, *, alone: bool = False) -> tuple[CheckpointRef, dict[str, Any]]:
        """Download the checkpoint named by `path` (its last segment is the step folder) and
        verify it as the volume store does; the ref names its place in the bucket. A sharded
        checkpoint's files are read from the bucket into the checked copies its restore reads."""
        name = PurePosixPath(str(path)).name
        step = step_of(name)
        if step is None:
            raise CorruptCheckpoint(f"{path}: not a checkpoint folder")
        start = time.perf_counter()
        folder = Path(tempfile.mkdtemp(prefix=".download-", dir=self.root)) / name
        folder.mkdir()
        try:
            files = download(self.bucket, f"{self.key}/{name}", folder, Peers(0, 1) if alone else Peers.current())
            ref, state = self.local.verify(folder, alone=alone, files=files)
            keep_framework(folder, self.root)
        finally:
            shutil.rmtree(folder.parent, ignore_errors=True)
        self.metrics.checkpoint_restore_seconds.observe(time.perf_counter() - start)
        return ref.model_copy(update={"path": self.url(step)}), state

    def framework_folder(self, ref: CheckpointRef) -> Path:
        """The framework checkpoint of `ref` here: as its `verify` downloaded it (bucket_files.keep_framework)."""
        return kept_framework(self.root, PurePosixPath(ref.path).name)

    # -- writing ----------------------------------------------------------------------------
    def write(
        self, step: int, precision: str, state: dict[str, Any], *, adopt: Path | None = None,
        joined: objects.Published | None = None,
    ) -> SaveResult:  # fmt: skip
        """Write `state` as `step`'s checkpoint: files first, the manifest last (the commit). `joined`: files
        the other ranks of a framework's save published (checkpoint.rank_files), named in the manifest
        beside its own, or withdrawn when it commits none (its place kept, a failure before the commit)."""
        joined = joined or objects.Published(objects.new_writer(), {})
        with self._writing:
            start = time.perf_counter()
            try:
                kept = ownership.occupied(self, self.url(step))
                if kept is not None:
                    self.withdraw(step, sorted(joined.files), writer=joined.writer)
                    return SaveResult(kept, time.perf_counter() - start, 0)
                spooled = self.local.write(step, precision, state, adopt=adopt)
            except Exception:
                self.withdraw(step, sorted(joined.files), writer=joined.writer)
                raise
            folder = Path(spooled.ref.path)
            try:
                uploaded, kept = self._upload(folder, step, joined)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if kept is not None:  # a save of the step committed meanwhile: the one there stays
                return SaveResult(kept, time.perf_counter() - start, 0)
            left = ownership.tidy(self, step)  # after the commit: the checkpoint is written whatever it says
            ref = spooled.ref.model_copy(update={"path": self.url(step)})
            return SaveResult(ref, time.perf_counter() - start, uploaded, left)

    def _upload(self, folder: Path, step: int, joined: objects.Published) -> tuple[int, CheckpointRef | None]:
        own = read_manifest(folder)  # its files go up after the joined ones: a name in both is its own
        manifest = replace(own, writer=joined.writer, files=dict(sorted({**joined.files, **own.files}.items())))
        try:
            size = self.publish(step, folder, own.files, writer=joined.writer)
        except Exception:
            self.withdraw(step, sorted(joined.files), writer=joined.writer)
            raise
        body = json.dumps(manifest.to_json()).encode()
        kept = bucket_commit.commit(self, step, body, list(manifest.files), writer=joined.writer)  # last, only now
        return size + sum(int(meta["bytes"]) for meta in joined.files.values()), kept

    def taken(self, step: int) -> CheckpointRef | None:
        """What a sharded save finds at `step`'s place before its ranks upload (as `write`
        checks: this job's valid checkpoint is kept; CheckpointTaken when it must write nothing)."""
        return ownership.occupied(self, self.url(step))

    def publish(self, step: int, folder: Path, files: dict[str, dict[str, Any]], *, writer: str) -> int:
        """Upload `files` (names relative to `folder`) into `writer`'s folder below `step`'s prefix:
        not yet a checkpoint; the manifest, put last, makes one. Returns their bytes; a failed
        upload withdraws what went up before it raises."""
        prefix = f"{self._step_prefix(step)}/{writer}"
        start, size, sent = time.perf_counter(), 0, []
        try:
            for name, meta in files.items():
                sent.append(name)  # before: an upload that fails may have landed all the same
                self.bucket.upload(f"{prefix}/{name}", folder / name)
                size += int(meta["bytes"])
        except Exception:
            self.metrics.checkpoint_commit_failures.inc()
            self.withdraw(step, sent, writer=writer)
            raise
        self.metrics.checkpoint_upload_seconds.observe(time.perf_counter() - start)
        self.metrics.checkpoint_upload_bytes.inc(size)
        return size

    def withdraw(self, step: int, names: list[str], *, writer: str) -> None:
        """Delete `names`, uploaded into `writer`'s folder of `step` by a save that will not commit."""
        leftovers.withdraw(self.bucket, self.log, f"{self._step_prefix(step)}/{writer}", names)

    def commit(
        self, tmp: Path, step: int, precision: str, files: dict[str, dict[str, Any]], *, world_size: int, writer: str
    ) -> SaveResult:
        """Rank 0, once every rank has published its files of a sharded save into `writer`'s
        folder (`files`: each one's sha256 and size): the manifest, the commit, then keep-K."""
        start = time.perf_counter()
        manifest = replace(self.local.sharded_manifest(step, precision, files, world_size=world_size), writer=writer)
        shutil.rmtree(tmp, ignore_errors=True)
        with self._writing:
            body = json.dumps(manifest.to_json()).encode()
            kept = bucket_commit.commit(self, step, body, sorted(files), writer=writer)
            if kept is not None:  # a save of the step committed meanwhile: the one there stays
                return SaveResult(kept, time.perf_counter() - start, 0)
            left = ownership.tidy(self, step)  # after the commit: the checkpoint is written whatever it says
        ref = CheckpointRef(step=step, path=self.url(step), sha256=manifest.state_sha256, precision=precision)
        return SaveResult(ref, time.perf_counter() - start, sum(int(meta["bytes"]) for meta in files.values()), left)
