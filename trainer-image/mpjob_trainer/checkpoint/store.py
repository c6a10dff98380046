"""CheckpointStore: a job's checkpoints in one folder, written atomically, never overwritten
in place, verified before they are trusted.

Layout under the checkpoint directory: `step-000000200/` per checkpoint (its format:
checkpoint.manifest), `.tmp-*` folders being written or deleted, `.corrupt-*` ones set aside,
`.unloadable-<step folder>` marks of checkpoints that did not load (checkpoint.unloadable).
A checkpoint is written into `.tmp-<step>-<pid>-<random>/` (never another writer's: two pods'
trainers have the same pid), each file fsynced, the manifest last, the folder fsynced, then
renamed into place: a process killed at any moment leaves either a complete checkpoint or a
temp folder that loading ignores and `clean_stale` removes. The rename, made durable by the
folder's fsync, is the commit point: a failure up to it is a save not written (its temp folder
removed), and nothing after it unwrites the checkpoint. The newest `keep` are kept; older
ones are pruned only after the new one is durable (ownership.tidy: a prune that fails is
reported beside the save, and the next save's prune does what it left), each renamed to a
`.tmp-pruned-*` folder before its files go. Of the job's damaged checkpoints set aside (a save of their step replaces
them), the newest CORRUPT_KEPT stay for diagnosis, pruned the same way.

The store implements checkpoint.protocol's Store over the folders (`steps`, `named`,
`manifest`, `verify`, `set_aside`, `discard`); what it decides with them is the same for every
store: which of them are its job's, how a step is claimed and what keep-K prunes
(checkpoint.ownership: only checkpoints whose manifest names its own job are pruned or moved
aside), and which one a resume takes (checkpoint.resume).

A sharded checkpoint (checkpoint.shards: every rank's files, written by all ranks into one
`.tmp-*` folder) is committed through `commit` by rank 0, the same manifest-last, rename,
keep-K path. Loading verifies the manifest (format version included), every file's sha256, the
config digest and the step (which checkpoint to load: checkpoint.resume); the ranks agree on each
verdict. Writes are serialised by a lock: a synchronous save never interleaves with a background one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint import folders, ownership, shards, unloadable
from mpjob_trainer.checkpoint.capture_keys import SHARDS, foreign_keys_problem
from mpjob_trainer.checkpoint.checked import CheckedSource, load_checked
from mpjob_trainer.checkpoint.lineage import UNJUDGED, Lineage
from mpjob_trainer.checkpoint.manifest import (
    DCP,
    FORMAT_VERSION,
    FRAMEWORK,
    SINGLE,
    STATE,
    CorruptCheckpoint,
    Manifest,
    check_files,
    check_loadable,
    folder_name,
    fsync_dir,
    hash_tree,
    read_manifest,
    state_problem,
    step_of,
    write_manifest,
)
from mpjob_trainer.checkpoint.migrate import FORMAT_KEY
from mpjob_trainer.checkpoint.ownership import CORRUPT_KEPT, CheckpointTaken
from mpjob_trainer.checkpoint.peers import Peers, agreed
from mpjob_trainer.checkpoint.protocol import Log

__all__ = ["CORRUPT_KEPT", "CheckpointStore", "CheckpointTaken", "Log", "SaveResult"]


@dataclass
class SaveResult:
    ref: CheckpointRef
    seconds: float
    bytes: int
    #: What the housekeeping after the commit left undone, and why (ownership.tidy); the
    #: checkpoint is written all the same. None: all done.
    housekeeping: str | None = None


class CheckpointStore:
    def __init__(
        self, root: Path, keep: int, config_digest: str, log: Log | None = None, *, job: str = "", build: str = "",
        lineage: Lineage = UNJUDGED,
    ) -> None:  # fmt: skip
        self.root, self.lineage = root, lineage  # lineage: who writes here, what a resume goes on from
        self.build = build or unloadable.build(None)  # checkpoint.protocol's (default: the image not known)
        self.keep = keep
        self.config_digest = config_digest
        self.job = job  # written into every manifest: what this store may prune or move aside
        self.log: Log = log or (lambda *a, **k: None)
        folders.writable_folder(root)
        self.unloadable: set[Path] = set()
        self._writing = threading.Lock()

    # -- the folders this store owns (checkpoint.protocol's operations) -------------------
    def steps(self) -> list[tuple[int, Path]]:
        """The step folders, oldest first."""
        found = []
        for child in self.root.iterdir():
            step = step_of(child.name)
            if step is not None and child.is_dir():
                found.append((step, child))
        return sorted(found)

    def named(self, prefer: str) -> Path:
        """The folder `prefer` names: as `steps` lists it when it lists it, else as given."""
        given = Path(prefer)
        return next((path for _, path in self.steps() if path.resolve() == given.resolve()), given)

    def manifest(self, where: Path) -> Manifest | None:
        """The manifest of the folder `where` (None: no such folder; CorruptCheckpoint: no valid one)."""
        return read_manifest(where) if where.exists() else None

    def set_aside(self, where: Path) -> None:
        """Move this job's damaged checkpoint at `where` out of sight (`.corrupt-*`); of those it set
        aside the newest CORRUPT_KEPT stay (checkpoint.ownership.bound_aside)."""
        self._out_of_sight(where, folders.SET_ASIDE)
        ownership.bound_aside(self)

    def aside(self) -> list[Path]:
        """The `.corrupt-*` folders, oldest first (by step, then when they were set aside)."""
        return sorted(self.root.glob(f"{folders.SET_ASIDE}*"), key=folders.set_aside_order)

    def mark_unloadable(self, where: Path, mark: str | None) -> None:
        """`.unloadable-<step folder>` beside `where`, holding `mark` (None: removed)."""
        folders.write_mark(self.root, where.name, mark.encode() if mark is not None else None)

    def unloadable_mark(self, where: Path) -> bytes | None:
        """The `.unloadable-<step folder>` beside `where` (no more than unloadable.MARK_BYTES + 1)."""
        return folders.read_mark(self.root, where.name, unloadable.MARK_BYTES)

    def clear(self, wheres: list[Path]) -> None:
        """Nothing: a step folder here is committed whole (checkpoint.protocol.Store.clear)."""

    def discard(self, where: Path, manifest: Manifest) -> None:
        """Delete `where`, out of sight first: a process killed midway leaves a `.tmp-*` folder
        (clean_stale's), never a step folder with part of its files."""
        try:
            gone = self._out_of_sight(where, ".tmp-pruned-")
        except OSError:  # not this process's to move (a sticky folder of another user): left as it is
            return
        shutil.rmtree(gone, ignore_errors=True)

    def _out_of_sight(self, where: Path, kind: str) -> Path:
        """`where` renamed to `<kind><its name>-<random>`: no step folder, and a name no folder moved
        before has (the same step's, moved by a process of the same pid, included)."""
        moved = self.root / f"{kind}{where.name}-{secrets.token_hex(6)}"
        where.rename(moved)
        return moved

    def wrote(self, path: Path) -> bool:
        """Whether this store's job wrote the checkpoint at `path` (its manifest names the job)."""
        return ownership.wrote(self, path)

    def _claim(self, tmp: Path, step: int) -> tuple[Path, CheckpointRef | None]:
        """Move the finished `tmp` into place as `step`'s checkpoint, durably (the rename, then the
        store's folder fsynced: the commit point); returns the final folder and, when that step was
        already durable (kept, never overwritten), the existing ref."""
        final = self.root / folder_name(step)
        kept = ownership.occupied(self, final)
        if kept is not None:
            shutil.rmtree(tmp)
            return final, kept
        tmp.rename(final)
        fsync_dir(self.root)
        return final, None

    def clean_stale(self) -> None:
        """Remove temp directories left by processes that were killed mid-save."""
        for child in self.root.glob(".tmp-*"):
            shutil.rmtree(child, ignore_errors=True)

    def staging(self, name: str) -> Path:
        """An empty folder `.tmp-*` on the store's filesystem for a framework to write its
        checkpoint into before `write(..., adopt=...)` moves it in (leftovers: clean_stale)."""
        assert name.startswith(".tmp-"), name
        folder = self.root / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        return folder

    # -- reading ----------------------------------------------------------------------------
    def verify(
        self, path: Path, *, alone: bool = False, files: CheckedSource | None = None
    ) -> tuple[CheckpointRef, dict[str, Any]]:
        """Check manifest (its step the folder's), sha256 and config digest; return the ref and the
        loaded state. An older format's says so under FORMAT_KEY (TrainingState.restore migrates it);
        a sharded checkpoint's is this rank's small state, its folder under SHARDS (where
        TrainingState.restore reads the shards). Unless `alone`, the process group's ranks reject it
        together: for its manifest (one rank's copy may be stale or damaged), then its files (a
        sharded one's from `files`, a bucket's, where given)."""
        peers = Peers(0, 1) if alone else Peers.current()
        manifest = agreed(lambda: self._manifest_of(path), peers)
        if manifest.layout == DCP:
            state = shards.read_local(path, manifest, peers, hold=not alone, files=files)  # LISTED: the restore's
            state[SHARDS] = str(path)
        else:
            state = self._read_single(path, manifest)
        state.pop(FORMAT_KEY, None)  # the format is the manifest's word, never the state's own
        if manifest.layout == SINGLE and manifest.format_version != FORMAT_VERSION:
            state[FORMAT_KEY] = manifest.format_version
        sha256, precision = manifest.state_sha256, manifest.precision
        return CheckpointRef(step=manifest.step, path=str(path), sha256=sha256, precision=precision), state

    @staticmethod
    def framework_folder(ref: CheckpointRef) -> Path:
        """The framework checkpoint inside the checkpoint `ref` names: in its folder."""
        return Path(ref.path) / FRAMEWORK

    def _manifest_of(self, path: Path) -> Manifest:
        manifest = read_manifest(path)
        if step_of(path.name) not in (None, manifest.step):  # a copy of another step's folder: not this step's
            raise CorruptCheckpoint(f"{path.name}: its manifest is of step {manifest.step}")
        if manifest.config_digest != self.config_digest:
            raise CorruptCheckpoint(
                f"{path.name}: config digest {manifest.config_digest!r} does not match this "
                f"job's {self.config_digest!r} (task or training settings changed)"
            )
        return manifest

    @staticmethod
    def _read_single(path: Path, manifest: Manifest) -> dict[str, Any]:
        check_files(path, replace(manifest, files={k: v for k, v in manifest.files.items() if k != STATE}))
        if (extra := folders.unlisted(path, manifest.files)) is not None:
            raise CorruptCheckpoint(f"{path.name}: {extra} is not in its manifest")
        state = load_checked(path, STATE, manifest.files[STATE])  # the bytes hashed, read once
        problem = state_problem(state, manifest.step) or foreign_keys_problem(state, sharded=False)
        if problem is not None:
            raise CorruptCheckpoint(f"{path.name}: {STATE} {problem}")
        return state

    # -- writing ----------------------------------------------------------------------------
    def write(self, step: int, precision: str, state: dict[str, Any], *, adopt: Path | None = None) -> SaveResult:
        """Write `state` as `step`'s checkpoint, atomically; a failed write leaves nothing behind.
        `state` must be a private copy: it is read while training may go on. `adopt`: the folder
        of a framework's finished checkpoint (on this filesystem), moved in as `framework/` and
        covered by the manifest."""
        check_loadable(state, step)
        tmp = self.root / f".tmp-{step:09d}-{os.getpid()}-{secrets.token_hex(6)}"  # no other writer's
        with self._writing:
            try:
                return self._write_via(tmp, step, precision, state, adopt)
            except Exception:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

    def _write_via(self, tmp: Path, step: int, precision: str, state: dict[str, Any], adopt: Path | None) -> SaveResult:
        start = time.perf_counter()
        tmp.mkdir(parents=True)
        if adopt is not None:
            adopt.rename(tmp / FRAMEWORK)  # the framework has finished writing: now it is ours
        with (tmp / STATE).open("wb") as f:
            torch.save(state, f)
        manifest = Manifest(step, precision, self.config_digest, FORMAT_VERSION, hash_tree(tmp), job=self.job)
        return self._commit(tmp, self.lineage.stamp(manifest), start)

    def commit(
        self, tmp: Path, step: int, precision: str, files: dict[str, dict[str, Any]], *, world_size: int
    ) -> SaveResult:
        """Make the sharded checkpoint every rank wrote into `tmp` (`files`: each file's sha256
        and size, as the ranks hashed them) `step`'s: manifest last, then the rename (rank 0)."""
        start = time.perf_counter()
        manifest = self.sharded_manifest(step, precision, files, world_size=world_size)
        with self._writing:
            try:
                return self._commit(tmp, manifest, start)
            except Exception:
                shutil.rmtree(tmp, ignore_errors=True)
                raise

    def sharded_manifest(
        self, step: int, precision: str, files: dict[str, dict[str, Any]], *, world_size: int
    ) -> Manifest:
        """The manifest that commits `step`'s sharded checkpoint of this job (`files`: every
        rank's, as the ranks hashed them); a bucket's commit writes the same."""
        fields = (step, precision, self.config_digest, FORMAT_VERSION, files, self.job, DCP, world_size)
        return self.lineage.stamp(Manifest(*fields))

    def _commit(self, tmp: Path, manifest: Manifest, start: float) -> SaveResult:
        write_manifest(tmp, manifest)
        fsync_dir(tmp)
        size = sum(meta["bytes"] for meta in manifest.files.values())
        final, existing = self._claim(tmp, manifest.step)
        if existing is not None:
            return SaveResult(existing, time.perf_counter() - start, size)
        step, sha256 = manifest.step, manifest.state_sha256
        left = ownership.tidy(self, step)  # after the commit: the checkpoint is written whatever it says
        ref = CheckpointRef(step=step, path=str(final), sha256=sha256, precision=manifest.precision)
        return SaveResult(ref, time.perf_counter() - start, size, left)
