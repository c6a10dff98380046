"""What a bucket save that never commits leaves (checkpoint.s3), and when it goes.

A save uploads its files into its writer's folder below the step's prefix, then commits by putting
the manifest, last. A put that fails may have landed all the same (the server stored the manifest
and its answer was lost, or botocore's retry of it was): deleting the files then would leave a
committed manifest naming objects that are not there. So the bucket is asked first (`landed`):
the save's own manifest there is a commit, and what it names stays; none, or another writer's (a
manifest names only its own writer's folder), and the save deletes what it uploaded (`withdraw`,
as one whose upload failed does). When the bucket cannot say either, the files stay, said in a
`checkpointUploadsLeft` line.

A save killed midway (SIGKILL, a node lost), or one whose files could not be deleted, leaves a
step folder without a manifest: no checkpoint, which keep-K neither counts nor deletes. Keep-K's
prune (checkpoint.ownership.prune) clears the oldest such folder among those it examines below
the step just saved (`clear`: one a save, so a backlog drains save by save, and a clear cut midway
is redone by the next): every object below that step folder goes. A step folder a checkpoint was
set aside from (its manifest below `.corrupt/`, its objects where they were) is left whole while
that one is kept for diagnosis (until ownership.bound_aside deletes it), and the next such folder
is cleared instead. Every key is made from the job's own prefix and the step's folder: nothing
outside them is listed or deleted.

Why a clear never takes a save in progress. It runs in the process that just committed `saved`,
after the commit, on step folders below it holding no manifest; its own saves run one at a time
(the store's lock, one writer thread); a sharded save's other ranks upload into the step being
committed, and finished before the agreement that precedes the commit; an attempt starts once its
predecessor's pods are gone (the operator waits for them: planning.reconcile; `mpjob run` runs one
attempt at a time). That leaves writers the operator lost track of: a stray Job (checkpoint.lineage)
or a pod on a node cut off from the cluster that still runs, at any step. So a folder is cleared
only when none of its objects was written for QUIET, by the bucket's own clock: no save's uploads
stand still that long (a stalled request fails within minutes, botocore's timeouts and retries
spent, and the save with it), so no writer is still uploading into it and about to put its
manifest. A folder whose listing shows a manifest (one landed since the prune read it) is left.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from mpjob_trainer.checkpoint import objects
from mpjob_trainer.checkpoint.bucket import LIST_PAGE, Bucket
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.manifest import MANIFEST, step_of
from mpjob_trainer.checkpoint.protocol import Log

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore

#: How long none of the objects of a step folder without a manifest was written before a prune
#: clears it: far longer than any save's uploads stand still.
QUIET = timedelta(days=1)


def withdraw(bucket: Bucket, log: Log, files: str, names: list[str]) -> None:
    """Delete the files `names` below `files` that a save which will not commit uploaded (no manifest
    names them); logged when that fails: the save's own failure is the one raised."""
    try:
        bucket.delete([f"{files}/{name}" for name in names])
    except Exception as exc:
        log("checkpointUploadsLeft", prefix=files, problem=str(exc))


def not_put(bucket: Bucket, log: Log, key: str, body: bytes, files: str, names: list[str]) -> None:
    """After the put of the manifest `body` as `key` failed: its files `names` (below `files`) go,
    unless it `landed` all the same."""
    if not landed(bucket, log, key, body, files):
        withdraw(bucket, log, files, names)


def landed(bucket: Bucket, log: Log, key: str, body: bytes, files: str) -> bool:
    """Whether the manifest `body`, whose put as `key` failed, is there all the same: a commit, so the
    files it names (below `files`) stay. True too when the bucket cannot say (they stay, logged)."""
    try:
        return bucket.get(key, max_bytes=MAX_MANIFEST_BYTES) == body
    except Exception as exc:
        problem = f"whether its manifest landed is unknown: {type(exc).__name__}: {exc}"
        log("checkpointUploadsLeft", prefix=files, problem=problem)
        return True


def abort(bucket: Bucket, log: Log, key: str) -> None:
    """Abort the unfinished multipart uploads below the job's prefix `key` (at an attempt's start:
    its predecessor's pods are gone, so they are saves that were killed midway)."""
    aborted = bucket.abort_uploads(key)
    if aborted:
        log("checkpointUploadsAborted", count=aborted)


def clear(store: BucketCheckpointStore, wheres: list[str], now: datetime | None = None) -> None:
    """Of the step folders `wheres` (oldest first), which held no manifest when the prune read them,
    clear the first that holds no set-aside checkpoint's objects (one a save; no more than a listing's
    page of it: the rest, the next), once none of its objects was written for QUIET."""
    aside = {objects.aside_step(PurePosixPath(where).name) for where in store.aside()}
    free = [where for where in wheres if step_of(PurePosixPath(where).name) not in aside]
    if not free:
        return
    prefix = objects.place_prefix(store.key, free[0])
    found = store.bucket.ages(prefix, LIST_PAGE)
    if found and MANIFEST not in found and max(found.values()) <= (now or datetime.now(UTC)) - QUIET:
        store.bucket.delete([f"{prefix}/{name}" for name in sorted(found)])
