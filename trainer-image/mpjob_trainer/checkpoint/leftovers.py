"""What a bucket save that never commits leaves (checkpoint.s3), and when it goes.

A save uploads its files into its writer's folder below the step's prefix, then commits by putting
the manifest, last. A put that fails may have landed all the same (the server stored the manifest
and its answer was lost, or botocore's retry of it was): deleting the files then would leave a
committed manifest naming objects that are not there. So the bucket is asked first (`landed`):
the save's own manifest there is a commit, and what it names stays; none, or another writer's (a
manifest names only its own writer's folder), and the save deletes what it uploaded (`withdraw`,
as one whose upload failed does). When the bucket cannot say either, the files stay, said in a
`checkpointUploadsLeft` line.
"""

from __future__ import annotations

from mpjob_trainer.checkpoint.bucket import Bucket
from mpjob_trainer.checkpoint.document import MAX_MANIFEST_BYTES
from mpjob_trainer.checkpoint.protocol import Log


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
