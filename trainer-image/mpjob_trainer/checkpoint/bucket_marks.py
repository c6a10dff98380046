"""The marks of a bucket's checkpoints that verify and do not load (checkpoint.unloadable), listed
once: a resume examines up to MAX_EXAMINED checkpoints, and asking the bucket for each one's mark
(almost always none) doubled its requests. One bounded listing of `<job>/.unloadable/` tells which
marks exist; only those are read. This process's own marks and removals keep the listing true (the
ranks of one attempt agree on what does not load in memory: `store.unloadable`), and a mark another
process writes later is of a later attempt's concern."""

from __future__ import annotations

from pathlib import PurePosixPath

from mpjob_trainer.checkpoint import objects
from mpjob_trainer.checkpoint.bucket import Bucket

#: The most marks listed; one a step that ever failed to load, so far more than are ever kept.
MAX_MARKS = 1000


class BucketMarks:
    """The marks below the job's prefix `key` of `bucket`, read at most `max_bytes` each."""

    def __init__(self, bucket: Bucket, key: str, max_bytes: int) -> None:
        self.bucket, self.key, self.max_bytes = bucket, key, max_bytes
        self._listed: set[str] | None = None

    def write(self, where: str, mark: str | None) -> None:
        """The mark of the step folder `where` names, holding `mark` (None: deleted)."""
        name, key = PurePosixPath(where).name, objects.mark_key(self.key, where)
        if mark is None:
            self.bucket.delete([key])
            self.listed().discard(name)
            return
        self.bucket.put(key, mark.encode())
        self.listed().add(name)

    def read(self, where: str) -> bytes | None:
        """The mark of `where` as stored (unchecked), None when the listing holds none."""
        if PurePosixPath(where).name not in self.listed():
            return None
        return self.bucket.get(objects.mark_key(self.key, where), max_bytes=self.max_bytes)

    def listed(self) -> set[str]:
        if self._listed is None:
            self._listed = set(self.bucket.sizes(f"{self.key}/{objects.UNLOADABLE}", MAX_MARKS))
        return self._listed
