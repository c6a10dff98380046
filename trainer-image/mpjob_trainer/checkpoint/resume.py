"""Which checkpoint an attempt resumes from, for every store (checkpoint.protocol).

The named one (launch.resumeFrom) if it is valid, else the newest valid one; a checkpoint that
fails verification is logged (`checkpointRejected`) and the next candidate is tried, so a
corrupt or mismatched newest checkpoint falls back to the previous good one. A checkpoint outside
the attempt's lineage (a stray attempt's: checkpoint.lineage) is no candidate, logged
(`checkpointOutsideLineage`), never deleted. With `newer_in`,
valid checkpoints of that precision newer than the named one come first: the attempt that was
told to resume from `prefer` wrote them itself before it was stopped (a queue preempted it, a
restarted operator recreated its Job) and restarts with the same launch; no earlier attempt in
that precision can have gone past the checkpoint it was given.

With `restore`, a checkpoint is taken only once its state is loaded into the run: a sharded
checkpoint's shards are read only then (DCP reads what the run needs now), so a shard that
passes its sha256 check and still fails to load (a manifest recomputed over a damaged or planted
file) is rejected like one that fails verification, and the next candidate is tried; the store
remembers it (on every rank when any rank failed to load it) and marks it for later attempts
(checkpoint.unloadable), so a save of its step replaces it rather than keeping it, and a resume
or a rollback, in this process or a later one, passes it over without loading it again.

Under a process group every rank resumes the same checkpoint: the ranks try rank 0's candidates
(another writer's save landing between two ranks' listings changes no list), and a checkpoint
any rank rejects (its files, or its restore, failed there) is rejected by all of them. The ranks
agree on a checkpoint's files before any of them loads it, so one rejected for its files is
loaded nowhere. One that verifies on every rank and still fails to load on some (its restore)
may be loaded on the others already, and one whose loading failed midway (a sharded one's shards
that DCP could not read to the end: PartlyLoaded) may be in part on every rank: the next
candidate, loaded on every rank, makes their states one again, and with none left the attempt
ends (ResumedApart, an InfraError) instead of starting at step 0 from states that differ (DDP
never re-syncs parameters) or from half-loaded weights. The retry's new
processes start from their initial state and pass the marked checkpoint over (should its mark
be lost, they try it again, and one that keeps failing so ends two attempts alike, before their
first step, and the job with them: operator planning.repeat). A single process that could not
load one at all still starts at step 0.
A rank whose reading or restore of a checkpoint fails without a verdict on it (an I/O error; a
ConfigError: the run does not fit it) ends the resume on every rank (checkpoint.peers): its error
there, PeerFailed on the others, or the same ConfigError, never a rank left alone in an agreement.

A run that goes back to its last good checkpoint (session: the fp32 replay, a rollback) takes it
by the same rule (`back_to`): one that fails verification or its restore (damaged since it was
saved) is rejected for the one before it, never blamed on the precision or the data; with none
left the attempt ends (NoGoodCheckpoint, an InfraError: retried in the same precision, whose
resume passes over it too).

Only the newest `protocol.MAX_EXAMINED` step folders are candidates (the named one besides):
each costs a manifest read, a request to a bucket, and a store crowded with folders (thousands
of damaged or foreign ones) must not turn a restore into thousands of them. Older ones are
left out with a `checkpointCandidatesCapped` log line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint import unloadable
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, PartlyLoaded, step_of
from mpjob_trainer.checkpoint.peers import Peers, agree
from mpjob_trainer.checkpoint.protocol import MAX_EXAMINED, Store, W

Loaded = tuple[CheckpointRef, dict[str, Any]]
#: Loads a verified checkpoint into the run; CorruptCheckpoint when its files do not load.
Restore = Callable[[Loaded], None]


def load(
    store: Store[W], prefer: str | None = None, *, newer_in: str | None = None, restore: Restore | None = None
) -> Loaded | None:
    """The checkpoint to resume from and its state (loaded by `restore`), else None; call on
    every rank: they try rank 0's candidates (a save landing between two ranks' listings
    changes no rank's list)."""
    peers = Peers.current()
    places = peers.from_main(candidates(store, prefer, newer_in=newer_in) if peers.rank == 0 else None)
    return first_valid(store, places, restore)


def candidates(store: Store[W], prefer: str | None, *, newer_in: str | None = None) -> list[W]:
    """The places to try, in order: the newest MAX_EXAMINED, the named one besides."""
    newest_first = newest(store)
    ordered = [where for _, where in newest_first]
    preferred = store.named(prefer) if prefer else None
    if prefer is None or preferred is None:
        return within(store, ordered)
    floor = step_of(PurePosixPath(prefer).name)
    ahead = [
        where
        for step, where in newest_first
        if newer_in and floor is not None and step > floor and precision_of(store, where) == newer_in
    ]
    rest = [where for where in ordered if where != preferred and where not in ahead]
    return within(store, [*ahead, preferred, *rest])


def within(store: Store[W], places: list[W]) -> list[W]:
    """`places` less the checkpoints outside the store's lineage (checkpoint.lineage: a stray
    attempt's), each logged (`checkpointOutsideLineage`) and left as it is. One whose manifest
    cannot be read stays: its verification rejects it and says why."""
    if store.lineage.earlier is None:
        return places  # nothing to judge: no manifest read
    kept: list[W] = []
    for where in places:
        try:
            manifest = store.manifest(where)
        except CorruptCheckpoint:
            manifest = None
        problem = store.lineage.outside(manifest) if manifest is not None else None
        if problem is None:
            kept.append(where)
        else:
            store.log("checkpointOutsideLineage", path=str(where), problem=problem)
    return kept


def newest(store: Store[W]) -> list[tuple[int, W]]:
    """The newest MAX_EXAMINED step folders of `store`, newest first (the rest logged as left out)."""
    found = store.steps()
    if len(found) > MAX_EXAMINED:
        store.log("checkpointCandidatesCapped", found=len(found), examined=MAX_EXAMINED)
    return list(reversed(found[-MAX_EXAMINED:]))


def precision_of(store: Store[W], where: W) -> str | None:
    """The precision the manifest at `where` names (None when there is none, or it is unreadable)."""
    try:
        manifest = store.manifest(where)
    except CorruptCheckpoint:
        return None
    return manifest.precision if manifest is not None else None


class ResumedApart(Exception):
    """Some rank loaded a checkpoint, in whole or in part, that was then rejected, and no other one
    loads on every rank: the ranks' states are not their initial ones (nor one another's), so this
    attempt cannot start at step 0 (an InfraError; the next attempt's processes start from their
    initial state)."""


class NoGoodCheckpoint(Exception):
    """A run going back to its last good checkpoint found none at or before it that loads on every
    rank (an InfraError: the next attempt, in the same precision, resumes past the rejected ones)."""


def back_to(store: Store[W], step: int, restore: Restore) -> Loaded:
    """The newest checkpoint at or before `step` (the last good one's) that verifies and that
    `restore` loads on every rank, as `first_valid` takes one (rank 0's list on every rank);
    NoGoodCheckpoint when none does, the run's state then maybe loaded in part."""
    peers = Peers.current()
    before = [where for at, where in newest(store) if at <= step] if peers.rank == 0 else []
    places = peers.from_main(within(store, before) if peers.rank == 0 else None)
    try:
        loaded = first_valid(store, places, restore)
    except ResumedApart as exc:
        raise NoGoodCheckpoint(f"no checkpoint at or before step {step} loads on every rank: {exc}") from exc
    if loaded is None:
        tried = f"{places[0]} and the {len(places) - 1} before it were rejected" if places else "none is left"
        raise NoGoodCheckpoint(f"no checkpoint at or before step {step} verifies and loads: {tried}")
    return loaded


def first_valid(store: Store[W], places: list[W], restore: Restore | None = None) -> Loaded | None:
    """The first of `places` that verifies (and that `restore` loads) on every rank, with its
    state; None when none does. A place any rank rejects is rejected by all of them: ranks that
    resumed apart would train two states from two steps. The ranks agree on a place's files
    before any of them loads it; ResumedApart when a rank loaded one the others rejected and no
    later one loads on every rank (a start at step 0 would train from two states)."""
    peers = Peers.current()
    apart: W | None = None  # a checkpoint some rank loaded and another could not
    for where in places:
        loaded, problem, failure = _verified(store, where)
        if _agreed(store, where, problem, peers, failure):
            assert loaded is not None  # no rank found a problem, this one included
            if restore is None:
                return loaded
            problem, failure, changed = _restored(loaded, restore)
            if _agreed(store, where, problem, peers, failure):
                return loaded
            unloadable.remember(store, where, loaded[0].sha256)  # every rank: a save of its step replaces it
            if any(peers.gather(changed)) and apart is None:
                apart = where
    if apart is not None:
        raise ResumedApart(
            f"{apart}: it was loaded, in whole or in part, on some rank and then rejected, and no other "
            "checkpoint loads on every rank: the ranks' states are no longer their initial ones, so this "
            "attempt cannot start at step 0"
        )
    return None


def _agreed(store: Store[W], where: W, problem: str | None, peers: Peers, failure: Exception | None) -> bool:
    """Whether no rank found a `problem` with the place `where` (else it is logged as rejected); a
    rank's `failure` (no verdict: an I/O error, a ConfigError) ends the resume on every rank."""
    try:
        agree(problem, peers, failure)
    except CorruptCheckpoint as exc:
        store.log("checkpointRejected", path=str(where), problem=str(exc))
        return False
    return True


def _verified(store: Store[W], where: W) -> tuple[Loaded | None, str | None, Exception | None]:
    """This rank's reading of the checkpoint at `where`: its verified state, or why not (a problem
    with it), or how the reading failed (no verdict on it)."""
    try:
        known = unloadable.passed_over(store, where)  # an earlier try could not load it: not again
        return (None, known, None) if known is not None else (store.verify(where), None, None)
    except CorruptCheckpoint as exc:
        return None, str(exc), None
    except Exception as exc:  # raised on every rank by the agreement: none left waiting in it
        return None, None, exc


def _restored(loaded: Loaded, restore: Restore) -> tuple[str | None, Exception | None, bool]:
    """Why `restore` could not load the verified checkpoint `loaded` on this rank (None: it did),
    or how it failed (a ConfigError: the run does not fit it); and whether this rank's state may
    have changed (it loaded it, or part of it)."""
    try:
        restore(loaded)
    except CorruptCheckpoint as exc:
        return str(exc), None, isinstance(exc, PartlyLoaded)
    except Exception as exc:  # raised on every rank by the agreement: none left waiting in it
        return None, exc, True
    return None, None, True
