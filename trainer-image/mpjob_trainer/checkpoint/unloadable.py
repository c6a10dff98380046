"""Checkpoints that verify and still do not load, known beyond the process that found one, for
every store (checkpoint.protocol).

When the ranks agree that a checkpoint whose files pass their sha256 does not load
(checkpoint.resume), every rank remembers its place (`store.unloadable`) and rank 0 records it
beside the checkpoint, never inside it: a mark holding the state sha256 its manifest names
(`mark_unloadable`). A later attempt is another process, maybe in another precision, resuming
from the checkpoint before it; the mark tells it what this process knew: a resume or a rollback
passes the checkpoint over without loading it again, and a save of its step sets it aside (as a
damaged one is, checkpoint.ownership) and writes its own rather than keeping it.

A mark is read back as untrusted input: no more than MARK_BYTES, and it counts only while it
names the sha256 of the checkpoint now at its step (a checkpoint written there since is not the
one that did not load). The checkpoint itself is never moved aside for failing to load: a
restore that fails for the trainer's own fault (a newer image's bug) would then take good
checkpoints out of reach; marked, it stays where it is until a save of its step replaces it.
"""

from __future__ import annotations

import re

from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.protocol import Store, W

#: The most of a mark a store reads back: a sha256 in hex, with room for a line end.
MARK_BYTES = 128

_SHA256 = re.compile(rb"([0-9a-f]{64})\n?")


def remember(store: Store[W], where: W, sha256: str) -> None:
    """Every rank: the checkpoint at `where` (state sha256 `sha256`) did not load on some rank.
    This process remembers it; rank 0 marks it for later ones. A mark that cannot be written is
    logged and the attempt goes on (a later attempt then tries the checkpoint again)."""
    store.unloadable.add(where)
    if Peers.current().rank != 0:
        return
    try:
        store.mark_unloadable(where, sha256)
    except Exception as exc:  # a store's I/O error: this process still knows, later ones retry it
        store.log("checkpointRejected", path=str(where), problem=f"it did not load; marking it so failed: {exc}")


def known(store: Store[W], where: W, manifest: Manifest) -> bool:
    """Whether the checkpoint at `where`, whose manifest is `manifest`, is known not to load: this
    process found it so, or a mark beside it names its state sha256."""
    return where in store.unloadable or _names(store.unloadable_mark(where), manifest)


def passed_over(store: Store[W], where: W) -> str | None:
    """Why a resume or a rollback passes the checkpoint at `where` over without loading it (it is
    `known` not to load), else None (a manifest that cannot be read: its verification says so)."""
    here = where in store.unloadable
    mark = None if here else store.unloadable_mark(where)
    if not here and mark is None:
        return None  # the common case: one read, no manifest read
    try:
        manifest = store.manifest(where)
    except CorruptCheckpoint:
        return None
    if manifest is None or not (here or _names(mark, manifest)):
        return None
    return f"{where}: its files verify but it did not load in an earlier try (marked so beside it): passed over"


def _names(mark: bytes | None, manifest: Manifest) -> bool:
    """Whether `mark`, as read back, is exactly the state sha256 `manifest` names."""
    found = _SHA256.fullmatch(mark) if mark is not None else None
    return found is not None and found.group(1).decode() == manifest.state_sha256


def forget(store: Store[W], where: W) -> None:
    """The checkpoint at `where` was set aside (a save of its step replaces it): its mark goes."""
    store.unloadable.discard(where)
    store.mark_unloadable(where, None)
