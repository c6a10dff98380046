"""Each rank's stderr, passed on to the pod log unchanged, with its last lines kept.

A rank that dies before it can write a termination report (a script that does not exist, a
module that fails to import, a crash in native code) leaves its cause only in its stderr. As
Kubernetes' `terminationMessagePolicy: FallbackToLogsOnError` does for a container, the
launcher quotes the end of that stderr in the report it makes for the rank, so the cause
reaches the attempt's status message and not only the pod log.

The launcher reads each rank's stderr pipe as it becomes readable (its select() loop), writes
every byte through to its own stderr at once, and keeps a bounded tail: memory stays
TAIL_KEEP_BYTES per rank however much a rank writes.
"""

from __future__ import annotations

import contextlib
import os
import select

#: Bytes of each rank's stderr kept in memory (a ring: the newest win).
TAIL_KEEP_BYTES = 8192
#: What a report quotes at most: the last lines, in at most this many bytes (the status
#: message of an attempt keeps 1024 characters; the quote and its preface stay under that).
TAIL_LINES = 8
TAIL_BYTES = 800
_READ = 65536


class StderrTail:
    """The newest bytes of one rank's stderr, and the text a report quotes from them."""

    def __init__(self, keep: int = TAIL_KEEP_BYTES) -> None:
        self.keep = keep
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        if len(self._data) > self.keep:
            del self._data[: len(self._data) - self.keep]

    def text(self, *, lines: int = TAIL_LINES, limit: int = TAIL_BYTES) -> str:
        """The last `lines` non-blank lines, cut from the front to `limit` UTF-8 bytes."""
        decoded = bytes(self._data).decode("utf-8", errors="replace")
        kept = "\n".join(line.rstrip() for line in decoded.splitlines() if line.strip())
        kept = "\n".join(kept.splitlines()[-lines:])
        raw = kept.encode()
        if len(raw) <= limit:
            return kept
        return "..." + raw[len(raw) - limit + 3 :].decode("utf-8", errors="ignore")


class Tee:
    """One rank's stderr pipe: pump() moves what is readable to `sink` (our stderr) and the tail."""

    def __init__(self, fd: int, sink: int = 2) -> None:
        self.fd: int | None = fd
        self.sink: int | None = sink
        self.tail = StderrTail()
        os.set_blocking(fd, False)

    def pump(self) -> None:
        """Read until the pipe is empty (or closed: then close our end)."""
        while self.fd is not None:
            try:
                chunk = os.read(self.fd, _READ)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            self.tail.add(chunk)
            self._write(chunk)

    def _write(self, chunk: bytes) -> None:
        """Through to the pod log; a log that is gone costs the log, never the rank."""
        view = memoryview(chunk)
        while view and self.sink is not None:
            try:
                view = view[os.write(self.sink, view) :]
            except BlockingIOError:  # a non-blocking log that is full: wait until it drains
                select.select([], [self.sink], [])
            except OSError:
                self.sink = None

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
