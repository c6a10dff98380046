"""BackgroundWriter: one checkpoint write at a time, off the training thread.

The training thread submits a write and goes on; it learns how the write ended only when it
collects it (`wait`, or `poll` when it must not block), so the outcome of a background write
is reported at a point of the training thread's choosing, never from the writer thread. A
write that raised is re-raised by the collecting call, together with the step it was for.

The writes run on one thread that lives as long as the writer (a daemon: a write stuck on a
dead filesystem must not keep a finished attempt's process alive). Starting a thread per
save cost the training thread more than the rest of a sharded save's hand-over: `start()`
waits for the new thread to run, and the new thread, straight into DCP's planning, holds
the GIL for up to a switch interval (5 ms) before the training thread gets it back. Handing
a write to a waiting thread is a queue put.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


class WriteFailed(Exception):
    """The background write of checkpoint `step` raised `__cause__`."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(f"the checkpoint of step {step} was not written: {type(cause).__name__}: {cause}")
        self.step = step
        self.cause = cause


@dataclass
class _Write(Generic[T]):
    step: int
    work: Callable[[], T]
    done: threading.Event = field(default_factory=threading.Event)
    result: T | None = None
    error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # collected by wait()
            self.error = exc
        finally:
            self.done.set()


class BackgroundWriter(Generic[T]):
    def __init__(self) -> None:
        self._write: _Write[T] | None = None
        self._queue: queue.SimpleQueue[_Write[T]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, step: int, work: Callable[[], T]) -> None:
        """Run `work` (the write of checkpoint `step`) on the writer thread; the previous write
        must have been collected."""
        assert self._write is None, "collect the previous write first"
        self._write = _Write[T](step, work)
        if self._thread is None:  # the first save: the thread's start-up is paid once
            self._thread = threading.Thread(name="checkpoint-writer", daemon=True, target=self._serve)
            self._thread.start()
        self._queue.put(self._write)

    def _serve(self) -> None:
        while True:
            self._queue.get().run()

    def wait(self) -> T | None:
        """Wait for the write in flight and return its result (once); WriteFailed if it raised."""
        write, self._write = self._write, None
        if write is None:
            return None
        write.done.wait()
        if write.error is not None and not isinstance(write.error, Exception):
            raise write.error  # KeyboardInterrupt and the like are not a failed write
        if write.error is not None:
            raise WriteFailed(write.step, write.error) from write.error
        return write.result

    def poll(self) -> T | None:
        """The result of a finished write, without blocking (None while it runs)."""
        if self._write is not None and self._write.done.is_set():
            return self.wait()
        return None
