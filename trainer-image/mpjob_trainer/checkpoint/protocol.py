"""Store: the few operations in which a volume and a bucket really differ.

Everything a store decides (which checkpoint to resume from, which of them are its job's, what
happens to a checkpoint already at the step to save, what keep-K prunes) is written once, on
top of these operations, in checkpoint.resume and checkpoint.ownership. A store names a
checkpoint by a place of its own (`W`): a folder of the volume (CheckpointStore, whose sharded
checkpoints are a layout of the same folders, committed through the same claim and pruning), a
`s3://` location of the bucket (BucketCheckpointStore).

A store persists and reads; it holds no run's knowledge: which checkpoint is good (the one
resumed from, the last save reported) is the session's (session.checkpointing.Checkpointer).

Nothing a store reads is trusted before it is checked: `manifest` parses through
checkpoint.document, `verify` checks every file's sha256, the config digest and the step.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint.lineage import Lineage
from mpjob_trainer.checkpoint.manifest import Manifest

#: Called as log(event, **fields) for what the store decides on its own (a rejected checkpoint).
Log = Callable[..., None]

W = TypeVar("W")

#: The newest step folders a resume tries and a prune examines (each costs a manifest read, a
#: request to a bucket): a store holding thousands of folders costs no more than this many.
MAX_EXAMINED = 32


class Store(Protocol[W]):
    """A job's checkpoints in one place; `W` is how the store names one checkpoint."""

    #: The job that writes here (AttemptLaunch.job_identity): what this store may prune or replace.
    job: str
    #: How many of its job's checkpoints the store keeps.
    keep: int
    log: Log
    #: Places whose checkpoint verified but did not load (checkpoint.resume) in this process:
    #: corrupt, so a save of its step sets it aside instead of keeping it (later processes
    #: know it by its mark: checkpoint.unloadable).
    unloadable: set[W]
    #: The trainer build this process is (checkpoint.unloadable.build: its releases and image):
    #: what the marks it writes name, and the only build whose marks count for it.
    build: str
    #: The attempt that writes here and the run it goes on from: what a resume may take (checkpoint.lineage).
    lineage: Lineage

    def steps(self) -> list[tuple[int, W]]:
        """The step folders found, oldest first (whoever wrote them, whatever their state)."""
        ...

    def named(self, prefer: str) -> W | None:
        """The place of the checkpoint a launch's resumeFrom names (the place `steps` gives
        when it lists it); None when the store cannot name it at all."""
        ...

    def manifest(self, where: W) -> Manifest | None:
        """The manifest at `where`, checked; None when nothing is there (no checkpoint to read
        or to replace), CorruptCheckpoint when something is there that is not a valid one."""
        ...

    def verify(self, where: W, *, alone: bool = False) -> tuple[CheckpointRef, dict[str, Any]]:
        """The checkpoint at `where`, checked in full, and its state; CorruptCheckpoint if not.
        `alone`: checked by this process only (a sharded one is else checked by all ranks)."""
        ...

    def framework_folder(self, ref: CheckpointRef) -> Path:
        """Where the framework checkpoint inside the checkpoint `ref` lies on this machine, for a
        framework that reads a folder: a volume's in its folder, a bucket's where its `verify`,
        which came before, downloaded it (nothing there: it holds none)."""
        ...

    def set_aside(self, where: W) -> None:
        """Take this job's damaged checkpoint at `where` out of reach (a save replaces it), then
        bound those set aside (checkpoint.ownership.bound_aside)."""
        ...

    def aside(self) -> list[W]:
        """The places of the checkpoints set aside here, oldest first (by step, then when)."""
        ...

    def mark_unloadable(self, where: W, mark: str | None) -> None:
        """Record beside the checkpoint at `where`, never inside it, that it did not load: the
        `mark` checkpoint.unloadable.text wrote (its state sha256, the store's build), stored as
        given; None: remove that record."""
        ...

    def unloadable_mark(self, where: W) -> bytes | None:
        """The record `mark_unloadable` left beside `where`, as stored (no more than one byte past
        unloadable.MARK_BYTES: unchecked), or None when there is none."""
        ...

    def clear(self, wheres: list[W]) -> None:
        """Delete what saves that never committed left in one of the step folders `wheres` (oldest
        first), which hold no manifest and lie below the step just saved (checkpoint.ownership.prune):
        a bucket's objects of a save killed midway, once untouched long enough (checkpoint.leftovers).
        A volume has none: its step folders are committed whole, by a rename (a killed save's `.tmp-*`:
        clean_stale)."""
        ...

    def discard(self, where: W, manifest: Manifest) -> None:
        """Delete this job's checkpoint at `where`, committed or set aside (pruning; a bucket
        deletes only the objects its `manifest` lists, the names of which were checked when it
        was read)."""
        ...
