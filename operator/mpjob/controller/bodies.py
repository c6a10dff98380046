"""The newest MixedPrecisionJob bodies the operator has been shown, by job: a reconcile plans
from the one held instead of a GET, so a quiet tick asks the API server nothing.

A body is shown by kopf's watch (each event of the job: its creation, a spec edit, every status
write, the operator's own included) and by the operator's own status writes, whose answer is
the job as written (`adopt`). The newest wins by resourceVersion: an older body shown late (a
watch event behind a write's answer) never replaces a newer one. What a reconcile plans from
is only ever a guess at the stored job; what makes it safe is unchanged: every status write
holds only at the resourceVersion of the body it was planned from (`actions.write_status`), and
nothing is made or deleted that the written status does not record first. A write refused
(409: another writer, or a body behind the job) or any other failed reconcile leaves the job
`refused`: its next reconcile, after the work queue's backoff, GETs it (and watch events until
then are not taken: the GET is newer). A deleted job, or one a standby no longer acts on, is
forgotten; a GET that a forget overtook is not kept (the body of a job deleted meanwhile).

Memory stays bounded by the jobs with work: a finished job at rest (nothing more owed for it:
`reconciler._settle`) is `released`, and a watch event that queues no reconcile (kopf's listing
of a finished job, a write to one) only refreshes a body held already (`handlers.on_job_event`),
so thousands of finished jobs hold none; a reconcile of one (a spec edit) GETs it, as any job
that holds none.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpjob.controller.records import Key
from mpjob_contract.formats import whole_number

Body = dict[str, Any]


@dataclass
class Held:
    """A job's newest body and its resourceVersion; `body` None: refused, the next reconcile GETs."""

    body: Body | None
    version: int


def version_of(body: Body) -> int | None:
    """A body's resourceVersion as a number (the API server's are etcd revisions), or None."""
    version = (body.get("metadata") or {}).get("resourceVersion")
    return whole_number(version, digits=19) if isinstance(version, str) else None


def adopt(body: Body, written: Body | None) -> None:
    """Make `body` the job as a write of it answered (`written`: its metadata, spec and status at
    the version the write made); an answer about another object of the name (another UID) is not
    taken."""
    if not isinstance(written, dict):
        return
    if (written.get("metadata") or {}).get("uid") != (body.get("metadata") or {}).get("uid"):
        return
    body.clear()
    body.update(written)


class Bodies:
    """The newest body of each job (thread-safe: kopf's watch offers, the work queue's threads read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[Key, Held] = {}
        #: By job, the GETs in flight (a token each): a forget of the job drops its tokens, and a
        #: GET whose token is gone is not kept; a forget of another job leaves them be.
        self._reading: dict[Key, set[object]] = {}

    def offer(self, key: Key, body: Body, *, only_held: bool = False) -> None:
        """A body the watch delivered (or, `only_held`, a reconcile's body after its writes: kept
        only where one is held): kept if newer than the one held, never while the job is refused."""
        version = version_of(body)
        with self._lock:
            held = self._held.get(key)
            if version is None:  # no order to keep it by: the next reconcile reads
                self._held.pop(key, None)
                return
            newer = held.body is not None and version > held.version if held is not None else not only_held
            if newer:
                self._held[key] = Held(body, version)

    def body(self, key: Key, read: Callable[[], Body | None]) -> Body | None:
        """A copy of the job's newest body (the reconcile writes into it); `read()` (a GET) when
        none is held or the job is refused, and kept unless the job was forgotten meanwhile."""
        token = object()
        with self._lock:
            if (held := self._held.get(key)) is not None and held.body is not None:
                return copy.deepcopy(held.body)
            self._reading.setdefault(key, set()).add(token)
        try:
            fresh = read()
        except BaseException:
            with self._lock:
                self._done_reading(key, token)
            raise
        version = version_of(fresh) if fresh is not None else None
        with self._lock:  # checked and kept at once: a forget comes before both or after both
            kept, now = self._done_reading(key, token), self._held.get(key)
            if kept and version is not None and (now is None or now.body is None or version >= now.version):
                self._held[key] = Held(copy.deepcopy(fresh), version)
        return fresh

    def _done_reading(self, key: Key, token: object) -> bool:
        """The GET `token` of the job is over (the lock held): whether no forget of the job overtook it."""
        reading = self._reading.get(key, set())
        kept = token in reading
        reading.discard(token)
        if not reading:
            self._reading.pop(key, None)
        return kept

    def refused(self, key: Key) -> None:
        """A reconcile of the job failed (a 409 among others): its next one reads it anew."""
        with self._lock:
            if (held := self._held.get(key)) is not None:
                self._held[key] = Held(None, held.version)

    def release(self, key: Key) -> None:
        """Nothing more is owed for the job (finished, at rest): its body is not held (a
        reconcile of it reads it anew)."""
        with self._lock:
            self._held.pop(key, None)

    def forget(self, key: Key) -> None:
        """The job is gone, or this operator no longer acts on it."""
        with self._lock:
            self._held.pop(key, None)
            self._reading.pop(key, None)

    def __len__(self) -> int:
        return len(self._held)
