"""One list + watch of one kind in one namespace (or all), feeding the child cache: list, then
watch from the listing's version, resume after the server's timeout, list again when the
version is too old (410) or the stream broke.

Nothing one object carries can stop it: the cache turns each object into a record or skips it,
a line that is not JSON (or nests deeper than this process decodes, `documents`) is skipped, and
any other failure is followed by a fresh listing after a backoff (1 s, doubled per failure in a
row, at most 30 s). A failure is logged once while it repeats, in one line that names the
resource and namespace and says what the API server answered: a 403 is the operator's RBAC, and
a refusal that lasts must neither flood the log nor the API server.

Each watch says when it last made progress (a listing, an event, a watch the server ended), so
the liveness probe can tell a watch that is dead (its thread gone, failing for a minute, or
silent past the server's timeout) from one that is merely idle.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from mpjob.controller import documents
from mpjob.controller.cluster import REQUEST_TIMEOUT, raw, status_message
from mpjob.planning.classify import backoff_seconds

log = logging.getLogger("mpjob.operator.cache")

#: A watch request's server-side timeout; the watch is then resumed from its last version.
WATCH_SECONDS = 300
GONE, FORBIDDEN = 410, 403
#: The pause before the first retry of a failed listing or watch, and the longest (doubled per
#: failure in a row in between).
RETRY_SECONDS, RETRY_MAX_SECONDS = 1.0, 30.0
#: The most characters of the API server's message a log line repeats.
MESSAGE_CHARS = 300
#: What a 403 asks of whoever installed the operator.
GRANT = "the operator's RBAC (helm/mpjob/templates/rbac.yaml) must grant list and watch"
#: A watch failing without a break this long is dead (an outage of the API server included:
#: the operator can do nothing meanwhile, and a restart starts it afresh; kopf itself stops the
#: operator after about a minute of failed requests). The chart's probe restarts the pod after
#: three failures 20 s apart.
FAILING_SECONDS = 30.0
#: A watch with no event, listing or server timeout this long is hung: the server ends a watch
#: after WATCH_SECONDS, and the client's read timeout is 30 s past that.
SILENT_SECONDS = WATCH_SECONDS + 60.0


class Sink(Protocol):
    def relist(self, resource: str, namespace: str | None, objects: list[dict[str, Any]]) -> None: ...
    def apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Source:
    """A kind to list and watch: `call` is the client's list method, `selectors` its label or
    field selector."""

    resource: str
    namespace: str | None
    call: Callable[..., Any]
    selectors: dict[str, str] = field(default_factory=dict)
    group: str = ""  # the API group ("" for the core group's pods and events)

    @property
    def args(self) -> tuple[str, ...]:
        return () if self.namespace is None else (self.namespace,)

    @property
    def where(self) -> str:
        """`jobs.batch in namespace team-a`, as the API server and RBAC rules name them."""
        name = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{name} in namespace {self.namespace}" if self.namespace else f"{name} in every namespace"


class ListWatch(threading.Thread):
    def __init__(self, source: Source, *, cache: Sink, synced: threading.Event, stop: threading.Event) -> None:
        super().__init__(name=f"mpjob-watch-{source.resource}-{source.namespace or 'all'}", daemon=True)
        self.source, self.cache, self.synced, self.stop = source, cache, synced, stop
        self.progressed = time.monotonic()  # the last listing, event or watch the server ended
        self.failing = False  # the last listing or watch failed
        self._failures = 0  # listings and watches failed in a row
        self._problem: str | None = None  # the failure last logged, while it repeats

    def dead(self, now: float | None = None) -> str | None:
        """Why this watch is dead (for the liveness probe), or None while it lives."""
        if self.stop.is_set():
            return None
        if not self.is_alive():
            return f"{self.name} has ended"
        quiet = (time.monotonic() if now is None else now) - self.progressed
        if self.failing and quiet > FAILING_SECONDS:
            return f"{self.name} has failed for {quiet:.0f} s"
        if quiet > SILENT_SECONDS:
            return f"{self.name} has been silent for {quiet:.0f} s"
        return None

    def run(self) -> None:
        version: str | None = None
        while not self.stop.is_set():
            doing = "listing" if version is None else "watching"
            try:
                if version is None:
                    version, doing = self._list(), "watching"
                version = self._watch(version)
            except ApiException as exc:
                version = None
                if exc.status != GONE:  # too old a version: list again at once
                    self._retry_after(problem(doing, self.source, exc))
            except Exception as exc:  # never let one error stop the cache for good
                version = None
                self._retry_after(problem(doing, self.source, exc))

    def _retry_after(self, said: str) -> None:
        """Log a failure (once while it repeats) and wait out its backoff, or until stopped."""
        self.failing, self._failures = True, self._failures + 1
        if said != self._problem and not self.stop.is_set():  # a stop's own failure is no news
            log.warning("%s; retrying with backoff (at most every %.0f s)", said, RETRY_MAX_SECONDS)
            self._problem = said
        self.stop.wait(backoff_seconds(self._failures, base=RETRY_SECONDS, cap=RETRY_MAX_SECONDS))

    def _progress(self, *, listed: bool = False) -> None:
        """The watch made progress. A listing alone (`listed`) ends no run of failures: a watch
        that fails after each listing (an RBAC that grants list but not watch) backs off and is
        said once, as one failing throughout; the watch that follows a listing ends it."""
        self.progressed, self.failing = time.monotonic(), False
        if listed:
            return
        if self._problem is not None:
            log.info("%s: answered again after %d failures", self.source.where, self._failures)
        self._failures, self._problem = 0, None

    def _list(self) -> str:
        """List everything and hand it to the cache; the listing's resourceVersion."""
        src = self.source
        listing = raw(src.call, *src.args, _request_timeout=REQUEST_TIMEOUT, **src.selectors)
        self.cache.relist(src.resource, src.namespace, listing.get("items") or [])
        self.synced.set()
        self._progress(listed=True)
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        """Follow the watch from `version` until the server ends it; the last version seen, or
        None to list again."""
        src = self.source
        response = src.call(
            *src.args,
            **src.selectors,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(REQUEST_TIMEOUT[0], WATCH_SECONDS + 30),
            _preload_content=False,
        )
        try:
            for line in iter_resp_lines(response):
                if self.stop.is_set():
                    return version
                event = _event(line)
                if event is not None and event[0] == "ERROR":  # no progress
                    if event[1].get("code") == GONE:  # too old a version: list again
                        return None
                    raise RuntimeError(f"the server ended the watch: {event[1].get('message')}")
                self._progress()
                if event is None:
                    continue
                kind, obj = event
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self.cache.apply(src.resource, kind, obj)
        finally:
            response.release_conn()
        self._progress()  # the server ended the watch at its timeout
        return version


def _event(line: str | bytes) -> tuple[str, dict[str, Any]] | None:
    """A watch line as (type, object); None for an empty or unreadable line."""
    if not line:
        return None
    try:
        event = documents.loads(line)
    except ValueError as exc:
        reason = exc if isinstance(exc, documents.Undecodable) else "not JSON"
        log.warning("skipping a watch line (%s): %.80r", reason, line)
        return None
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        return None
    return str(event.get("type")), event["object"]


def problem(doing: str, source: Source, exc: Exception) -> str:
    """What a failed listing or watch of `source` says, in one line: what the API server answered
    (and, for a 403, what to grant), or what kept it from answering."""
    what = f"{doing} {source.where}"
    if not isinstance(exc, ApiException):
        return f"{what}: {type(exc).__name__}: {_one_line(str(exc))}"
    said = f"{what}: {exc.status} {exc.reason}"
    if message := _message(exc.body):
        said += f": {message}"
    return f"{said} — {GRANT}" if exc.status == FORBIDDEN else said


def _message(body: str | bytes | None) -> str:
    """The message of an API server's Status body (a body that is not one, as it came), in one line."""
    if not body:
        return ""
    text = status_message(body)
    if text is None:
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body)
    return _one_line(text)


def _one_line(text: str) -> str:
    return " ".join(text.split())[:MESSAGE_CHARS]
