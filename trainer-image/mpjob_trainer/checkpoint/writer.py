"""BackgroundWriter: one checkpoint write at a time, off the training thread.

The training thread submits a write and goes on; it learns how the write ended only when it
collects it (`wait`, or `poll` when it must not block), so the outcome of a background write
is reported at a point of the training thread's choosing, never from the writer thread. A
write that raised is re-raised by the collecting call, together with the step it was for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
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
    thread: threading.Thread
    result: T | None = None
    error: BaseException | None = None


class BackgroundWriter(Generic[T]):
    def __init__(self) -> None:
        self._write: _Write[T] | None = None

    def submit(self, step: int, work: Callable[[], T]) -> None:
        """Run `work` (the write of checkpoint `step`) in a thread; the previous write must
        have been collected."""
        assert self._write is None, "collect the previous write first"
        thread = threading.Thread(name=f"checkpoint-{step}", daemon=True, target=lambda: self._run(write, work))
        write = _Write[T](step, thread)
        self._write = write
        thread.start()

    @staticmethod
    def _run(write: _Write[T], work: Callable[[], T]) -> None:
        try:
            write.result = work()
        except BaseException as exc:  # collected by wait()
            write.error = exc

    def wait(self) -> T | None:
        """Join the write in flight and return its result (once); WriteFailed if it raised."""
        write, self._write = self._write, None
        if write is None:
            return None
        write.thread.join()
        if write.error is not None and not isinstance(write.error, Exception):
            raise write.error  # KeyboardInterrupt and the like are not a failed write
        if write.error is not None:
            raise WriteFailed(write.step, write.error) from write.error
        return write.result

    def poll(self) -> T | None:
        """The result of a finished write, without blocking (None while it runs)."""
        if self._write is not None and not self._write.thread.is_alive():
            return self.wait()
        return None
