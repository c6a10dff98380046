"""A bucket save's commit (checkpoint.s3): its manifest, put last, and only where no manifest is.

An object store has no rename, so the manifest is the commit; a put replaces what is there, so
a plain put of it would replace a checkpoint another writer committed at the step after this save
looked (ownership.occupied, before its upload): an attempt's pod still saving beside the next
attempt's, a stray Job, a save retried after a restart. The checkpoint that writer reported, and
a resume may have begun to read, would be replaced in place, its objects left behind named by no
manifest. So the manifest goes up as a conditional put (If-None-Match: checkpoint.put_if_absent) and the
first to land is the step's checkpoint. A put the bucket refuses because this save's own manifest
is there (a retry of a put that landed although its answer was lost) is the commit all the same.
Any other manifest there is judged as the save judged the place before its upload: this job's
valid checkpoint is kept (its ref: the save reports it, and its own files go); one it may not
replace raises CheckpointTaken (its files go); one it sets aside (damaged, a stray's) frees the
place for another put, COMMIT_TRIES in all. A failed put: checkpoint.leftovers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint import leftovers, ownership
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

#: How often a commit puts its manifest while the checkpoints it finds in its way are set aside.
COMMIT_TRIES = 3


class CommitContended(Exception):
    """Another save's manifest landed at the step each time this save's commit found the place freed."""


def commit(
    store: BucketCheckpointStore, step: int, body: bytes, names: list[str], *, writer: str
) -> CheckpointRef | None:
    """Commit the manifest `body` naming `writer`'s files `names` at `step`: None when committed,
    the ref of this job's valid checkpoint found there instead (kept; `names` deleted)."""
    for _ in range(COMMIT_TRIES):
        if _put(store, step, body, names, writer=writer):
            return None
        try:
            kept = ownership.occupied(store, store.url(step))
        except Exception:
            store.withdraw(step, names, writer=writer)
            raise
        if kept is not None:
            store.withdraw(step, names, writer=writer)
            return kept
    store.withdraw(step, names, writer=writer)
    store.metrics.checkpoint_commit_failures.inc()
    raise CommitContended(f"{store.url(step)}: another save's manifest landed there at each of {COMMIT_TRIES} tries")


def _put(store: BucketCheckpointStore, step: int, body: bytes, names: list[str], *, writer: str) -> bool:
    """Put the manifest `body` where no manifest is; False: another one is there."""
    prefix = f"{store.key}/{folder_name(step)}"
    key, files = f"{prefix}/{MANIFEST}", f"{prefix}/{writer}"
    try:
        created = store.put_if_absent(key, body) or store.bucket.get(key, max_bytes=MAX_MANIFEST_BYTES) == body
    except Exception:
        store.metrics.checkpoint_commit_failures.inc()
        leftovers.not_put(store.bucket, store.log, key, body, files, names)
        raise
    if created:
        store.metrics.checkpoint_upload_bytes.inc(len(body))
    return created
