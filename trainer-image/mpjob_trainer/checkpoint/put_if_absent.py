"""A put that lands only where no object is (a bucket commit's manifest: checkpoint.bucket_commit),
on whatever S3-compatible server holds the bucket.

A conditional put (`If-None-Match: *`) is that put where the server implements it. A server that
answers NotImplemented (501) says it does not; one that ignores the header (older S3-compatible
servers) says nothing and replaces the object, so the first put of a process puts a probe object
of its own below the job's prefix twice, conditionally: a second put that lands shows the
condition ignored. Such a server (told once per process: `checkpointPutUnconditional`) gets a look
at the key, then a plain put where nothing was there: the window in which another writer's manifest
can land and be replaced shrinks from the save's upload to the moments between the two requests.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.bucket import Bucket
    from mpjob_trainer.checkpoint.protocol import Log

#: The folder below a job's prefix that holds a probe object while the probe runs.
PROBES = ".probe"


class Condition(StrEnum):
    """What the bucket's server does with a put's If-None-Match."""

    UNKNOWN = "unknown"  # not probed yet
    HONOURED = "honoured"
    NOT_IMPLEMENTED = "notImplemented"  # 501
    IGNORED = "ignored"  # a second conditional put of a key landed


class PutIfAbsent:
    """`put_if_absent(key, body)`: True when `body` went up as `key`, False when an object was there."""

    def __init__(self, bucket: Bucket, prefix: str, log: Log) -> None:
        self.bucket, self.prefix, self.log = bucket, prefix, log
        self.condition = Condition.UNKNOWN

    def __call__(self, key: str, body: bytes) -> bool:
        if self.condition is Condition.UNKNOWN:
            self._learn(self._probe())
        if self.condition is Condition.HONOURED:
            created = self.bucket.create(key, body)
            if created is not None:
                return created
            self._learn(Condition.NOT_IMPLEMENTED)
        if self.bucket.get(key, max_bytes=0) is not None:
            return False
        self.bucket.put(key, body)
        return True

    def _probe(self) -> Condition:
        key = f"{self.prefix}/{PROBES}/{uuid.uuid4().hex}"
        try:
            first = self.bucket.create(key, b"")
            if first is None:
                return Condition.NOT_IMPLEMENTED
            return Condition.IGNORED if self.bucket.create(key, b"") else Condition.HONOURED
        finally:
            self._remove(key)

    def _remove(self, key: str) -> None:
        """Delete the probe object; one the bucket keeps (an error) is logged, never the commit's failure."""
        try:
            self.bucket.delete([key])
        except Exception as exc:
            self.log("checkpointUploadsLeft", prefix=key, problem=f"the probe object stays: {exc}")

    def _learn(self, condition: Condition) -> None:
        self.condition = condition
        if condition is not Condition.HONOURED:
            self.log("checkpointPutUnconditional", bucket=self.bucket.name, condition=str(condition))
