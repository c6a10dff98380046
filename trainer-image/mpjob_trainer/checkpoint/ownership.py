"""Which checkpoints a store's job owns, for every store (checkpoint.protocol): what keep-K
prunes and what a save does with a checkpoint already at its step.

A store acts only on checkpoints whose manifest names its own job (`job`,
AttemptLaunch.job_identity). Anything else found there (copied in by hand, written by another
job, a manifest that cannot be read) is never replaced, set aside or deleted, and neither
counts towards `keep` nor goes; a save that finds such a checkpoint at its own step writes
nothing (CheckpointTaken: at the job's last step a configuration error, session.interval). A
prune counts and removes only checkpoints up to the step just saved, and examines only the
newest `keep + MAX_EXAMINED` of those step folders (each a manifest read): a save prunes as it
goes, so its own older ones are within them. Of those folders below the step saved that hold no
manifest (saves that never committed: a bucket's killed uploads), it clears one (Store.clear;
checkpoint.leftovers says which, and when that is safe). Of the job's damaged checkpoints a
save set aside, the newest CORRUPT_KEPT stay for diagnosis and older ones go (`bound_aside`), on
every store.
A checkpoint of the job outside the attempt's lineage (a stray attempt's: checkpoint.lineage)
neither counts nor goes either, set aside or not; one at the step to save is set aside (said in
a `checkpointOutsideLineage` line), so the attempt's own save takes its place instead of taking
the stray's state for its own. One a later attempt wrote says this process is the stray: it
stays, and the save writes nothing (CheckpointTaken). Nor does a prune delete the newest
checkpoint another Job wrote (`stood_on`): a stray's keep-K would take the one a later attempt
went on from.
"""

from __future__ import annotations

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint import unloadable
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest
from mpjob_trainer.checkpoint.protocol import MAX_EXAMINED, Store, W

#: How many of the checkpoints its job set aside as damaged a store keeps for diagnosis.
CORRUPT_KEPT = 3


class CheckpointTaken(Exception):
    """The place of the step to save (`where`) holds a checkpoint this store's job did not write."""

    def __init__(self, where: object) -> None:
        super().__init__(f"{where} holds a checkpoint this job did not write: left as it is, not replaced")
        self.where = where

    def __reduce__(self) -> tuple[type[CheckpointTaken], tuple[object]]:
        """Pickled as its `where` (rank 0 tells the other ranks of a sharded save, checkpoint.sharded)."""
        return CheckpointTaken, (self.where,)


def own_manifest(store: Store[W], where: W) -> Manifest | None:
    """The manifest at `where` when this store's job wrote it, else None."""
    try:
        manifest = store.manifest(where)
    except CorruptCheckpoint:
        return None
    return manifest if manifest is not None and manifest.job == store.job else None


def lineal_manifest(store: Store[W], where: W) -> Manifest | None:
    """`own_manifest`'s, when the checkpoint is of the store's lineage too (checkpoint.lineage)."""
    manifest = _read(store, where)
    return manifest if isinstance(manifest, Manifest) and _lineal(store, manifest) else None


def _read(store: Store[W], where: W) -> Manifest | CorruptCheckpoint | None:
    """The manifest at `where`; None: there is none (no save committed there); else why it is no valid one."""
    try:
        return store.manifest(where)
    except CorruptCheckpoint as exc:
        return exc


def _lineal(store: Store[W], manifest: Manifest) -> bool:
    return manifest.job == store.job and store.lineage.outside(manifest) is None


def wrote(store: Store[W], where: W) -> bool:
    """Whether this store's job wrote the checkpoint at `where` (its manifest names the job)."""
    return own_manifest(store, where) is not None


def occupied(store: Store[W], where: W) -> CheckpointRef | None:
    """What a save finds at its step's place `where`: nothing (None); this job's valid checkpoint
    (its ref: kept, never overwritten); this job's damaged one (or one known not to load, in this
    process or an earlier one: checkpoint.unloadable), set aside (None: the new one takes its
    place); anything else is left as it is and the save writes nothing (CheckpointTaken)."""
    try:
        manifest = store.manifest(where)
    except CorruptCheckpoint:
        raise CheckpointTaken(where) from None
    if manifest is None:
        return None
    if manifest.job != store.job:
        raise CheckpointTaken(where)
    if (stray := store.lineage.outside(manifest)) is not None:
        if store.lineage.later(manifest):  # this process is the stray: the job's own is never touched
            store.log("checkpointOutsideLineage", path=str(where), problem=f"{stray}: left as it is, nothing saved")
            raise CheckpointTaken(where)
        store.log(
            "checkpointOutsideLineage", path=str(where), problem=f"{stray}: set aside, this attempt saves its step"
        )
        store.set_aside(where)
        return None
    try:
        if unloadable.known(store, where, manifest):
            raise CorruptCheckpoint(f"{where}: its files did not load")
        ref, _ = store.verify(where, alone=True)
    except CorruptCheckpoint:
        store.set_aside(where)
        unloadable.forget(store, where)  # after: a save killed between leaves a mark naming no checkpoint
        return None
    return ref


def tidy(store: Store[W], saved: int) -> str | None:
    """The housekeeping after step `saved`'s commit (keep-K's prune): the checkpoint is written
    whatever happens here, so a failure is returned, what was not done and why, never raised. What
    it left the next save's prune examines again: a checkpoint left unpruned stays committed, and
    a bucket's prune deletes the manifest last (BucketCheckpointStore.discard). The bound: a prune
    examines the newest `keep + MAX_EXAMINED` step folders, so only checkpoints left by more than
    MAX_EXAMINED failed prunes in a row fall out of its sight."""
    try:
        prune(store, saved)
    except Exception as exc:
        return f"older checkpoints not pruned: {type(exc).__name__}: {exc}"
    return None


def prune(store: Store[W], saved: int) -> None:
    """Keep this job's newest `keep` checkpoints up to step `saved` (the save just made), so that
    save is never one that goes; what the job did not write, and its checkpoints of later steps (a
    run this one did not go on from: damaged, of another config digest), neither count nor go.
    Nor does the newest another Job wrote (`stood_on`). Of the examined step folders below `saved`
    that hold no manifest (saves that never committed), one is cleared (`Store.clear`)."""
    examined = [(step, where) for step, where in store.steps() if step <= saved][-(store.keep + MAX_EXAMINED) :]
    found = [(step, where, _read(store, where)) for step, where in examined]
    ours = [(where, m) for _, where, m in found if isinstance(m, Manifest) and _lineal(store, m)]
    kept = stood_on(store, ours)
    for where, manifest in ours[: -store.keep]:
        if where != kept:
            store.discard(where, manifest)
    uncommitted = [where for step, where, manifest in found if manifest is None and step < saved]
    if uncommitted:
        store.clear(uncommitted)


def stood_on(store: Store[W], ours: list[tuple[W, Manifest]]) -> W | None:
    """Of the lineage's checkpoints `ours` (oldest first), the newest another Job wrote, when this
    process runs in a Job: a stray (checkpoint.lineage) cannot tell it is one until a later attempt
    saves, and that attempt went on from this checkpoint (the lineage's newest when it began, all
    written before the stray began): so no process deletes it, at the cost of one checkpoint more
    kept by the attempt that goes on from it, until the next attempt's prune."""
    others = [where for where, manifest in ours if store.lineage.other_job(manifest)]
    return others[-1] if others else None


def bound_aside(store: Store[W]) -> None:
    """Of the checkpoints this store's job set aside, keep the newest CORRUPT_KEPT and delete the
    rest (MAX_EXAMINED more examined, each a manifest read: a backlog drains); others' stay."""
    examined = store.aside()[-(CORRUPT_KEPT + MAX_EXAMINED) :]
    ours = [(where, manifest) for where in examined if (manifest := lineal_manifest(store, where)) is not None]
    for where, manifest in ours[:-CORRUPT_KEPT]:
        store.discard(where, manifest)
