"""What a signal handler of `mpjob run` says, said by a thread of its own.

A Python signal handler runs in the main thread between two of its bytecodes, wherever it stood:
holding a lock (a `threading.Event`'s, as it waits), or inside a write to the very stream the
handler would print to. A handler that took that lock again hung the run for good (only SIGKILL
ended it); one that printed raised "reentrant call inside <_io.BufferedWriter>" where the main
thread stood, ending the run mid-attempt. So the handler only leaves its line here (`post`: a
deque append and one byte on a pipe, neither takes a Python lock), and a daemon thread, woken by
the byte, shows the line at once (worker 0 may be silent for minutes) and wakes whoever waits for a
stop: a thread of its own, so the lock and the stream are taken in turn, never from inside themselves.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from collections.abc import Callable


class SignalRelay:
    """Lines posted by a signal handler, shown by a daemon thread in the order posted."""

    def __init__(self, show: Callable[[str], None]) -> None:
        self._show = show
        self._lines: collections.deque[str] = collections.deque()
        self._posted = 0  # written by the handler alone
        self._shown = 0  # written by the thread alone, under `_said`
        self._said = threading.Condition()  # the thread's and `settle`'s; never the handler's
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._thread = threading.Thread(target=self._serve, name="mpjob-run-signal-lines", daemon=True)
        self._thread.start()

    def post(self, line: str) -> None:
        """From a signal handler: `line` is shown soon, by the thread; no lock taken, nothing printed."""
        self._lines.append(line)
        self._posted += 1
        with contextlib.suppress(BlockingIOError):  # the pipe is full: the thread has bytes enough to wake for
            os.write(self._write, b"\0")

    def settle(self, timeout: float = 10.0) -> None:
        """Wait until the lines posted so far are shown, so that what the run says next comes after
        them (at most `timeout`: a view that failed has shown what it could)."""
        posted = self._posted
        with self._said:
            self._said.wait_for(lambda: self._shown >= posted, timeout)

    def close(self) -> None:
        """Once no handler can post any more: the lines left are shown, the thread has ended."""
        os.close(self._write)
        self._thread.join()
        os.close(self._read)

    def _serve(self) -> None:
        while os.read(self._read, 64):  # b"": closed, after the handler's time
            self._drain()
        self._drain()

    def _drain(self) -> None:
        while self._lines:
            try:
                self._show(self._lines.popleft())
            finally:
                with self._said:
                    self._shown += 1
                    self._said.notify_all()
