"""Checkpoints that verify and still do not load, known beyond the process that found one, for
every store (checkpoint.protocol).

When the ranks agree that a checkpoint whose files pass their sha256 does not load
(checkpoint.resume), every rank remembers its place (`store.unloadable`) and rank 0 records it
beside the checkpoint, never inside it: a mark (`text`), one line holding the state sha256 its
manifest names and the build of the trainer that could not load it (`build`: mpjob-trainer's
release, torch's and the job's image). A later attempt is another process, maybe in another
precision, resuming from the checkpoint before it; the mark tells it what this process knew: a
resume or a rollback passes the checkpoint over without loading it again, and a save of its step
sets it aside (as a damaged one is, checkpoint.ownership) and writes its own rather than keeping
it.

A mark is read back as untrusted input: no more than MARK_BYTES, and it counts only when it is
exactly one such line naming the sha256 of the checkpoint now at its step (a checkpoint written
there since is not the one that did not load) and the build of the trainer reading it (its
store's `build`). A restore that fails for the trainer's own fault (a bug of one image) must not
take good checkpoints out of reach of the image that fixes it, nor one that fails for the user's
code (a task.module, their objects through the SDK, a model class) out of reach of the user's
image that fixes that with the same mpjob-trainer and torch: so the build names the job's image
too (`launched`), by a short sha256 of its reference. Under another build the checkpoint is
tried again, and marked again (with that build) if it still does not load. A mark of a format
before (the sha256 alone, or no image) counts for nothing, as one of another build. The
checkpoint itself is never moved aside for failing to load: marked, it stays where it is until a
save of its step replaces it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re

import torch

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.tracking import IMAGE_ENV
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.protocol import Store, W

#: The most of a mark a store reads back: its one line, with room to spare (`_MARK` allows 238 bytes).
MARK_BYTES = 256
#: How many hex digits of the image reference's sha256 a build names (64 bits: two images of one
#: job never share them by chance).
IMAGE_DIGITS = 16

#: What a release may hold in a mark (PEP 440 and local versions: `2.11.0+cu128`); else `_`.
_RELEASE = re.compile(r"[^0-9A-Za-z.+_-]")
#: A mark, whole: the state sha256 in hex, a space, the build (`build`), one line end.
_MARK = re.compile(
    rb"([0-9a-f]{64}) (mpjob-trainer [0-9A-Za-z.+_-]{1,64} torch [0-9A-Za-z.+_-]{1,64} image (?:[0-9a-f]{%d}|-))\n"
    % IMAGE_DIGITS
)


@functools.cache
def _releases() -> str:
    """`mpjob-trainer <release> torch <release>`: this trainer's own part of a build."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        mine = version("mpjob-trainer")
    except PackageNotFoundError:  # a source tree on the path, not installed
        mine = "unknown"
    return f"mpjob-trainer {_RELEASE.sub('_', mine)[:64]} torch {_RELEASE.sub('_', torch.__version__)[:64]}"


def build(image: str | None) -> str:
    """This trainer's build, running in the image of reference `image` (None: not known), as a
    mark names it: `mpjob-trainer <release> torch <release> image <the first IMAGE_DIGITS hex
    digits of the reference's sha256, or ->`."""
    named = hashlib.sha256(image.encode()).hexdigest()[:IMAGE_DIGITS] if image else "-"
    return f"{_releases()} image {named}"


def launched(launch: AttemptLaunch) -> str:
    """The build of this trainer running the attempt `launch`: in the job's image (spec.image,
    which `mpjob run` has too), else the one the operator started the container from, its default
    trainer image ($MPJOB_IMAGE)."""
    return build(launch.spec.image or os.environ.get(IMAGE_ENV) or None)


def text(sha256: str, by: str) -> str:
    """The mark of the checkpoint of state sha256 `sha256` that the trainer build `by` could not load."""
    return f"{sha256} {by}\n"


def remember(store: Store[W], where: W, sha256: str) -> None:
    """Every rank: the checkpoint at `where` (state sha256 `sha256`) did not load on some rank.
    This process remembers it; rank 0 marks it for later ones. A mark that cannot be written is
    logged and the attempt goes on (a later attempt then tries the checkpoint again)."""
    store.unloadable.add(where)
    if Peers.current().rank != 0:
        return
    try:
        store.mark_unloadable(where, text(sha256, store.build))
    except Exception as exc:  # a store's I/O error: this process still knows, later ones retry it
        store.log("checkpointRejected", path=str(where), problem=f"it did not load; marking it so failed: {exc}")


def known(store: Store[W], where: W, manifest: Manifest) -> bool:
    """Whether the checkpoint at `where`, whose manifest is `manifest`, is known not to load: this
    process found it so, or a mark beside it names its state sha256 and this trainer's build."""
    return where in store.unloadable or _names(store.unloadable_mark(where), manifest, store.build)


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
    if manifest is None or not (here or _names(mark, manifest, store.build)):
        return None
    return (
        f"{where}: its files verify but it did not load in an earlier try of this trainer build and image "
        "(marked so beside it): passed over"
    )


def _names(mark: bytes | None, manifest: Manifest, by: str) -> bool:
    """Whether `mark`, as read back, is exactly the mark (`text`) the trainer build `by` would
    write for the checkpoint of `manifest`."""
    found = _MARK.fullmatch(mark) if mark is not None else None
    return found is not None and found.group(1).decode() == manifest.state_sha256 and found.group(2).decode() == by


def forget(store: Store[W], where: W) -> None:
    """The checkpoint at `where` was set aside (a save of its step replaces it): its mark goes."""
    store.unloadable.discard(where)
    store.mark_unloadable(where, None)
