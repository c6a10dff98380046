"""Two writers of one step at once, as an attempt's trainer still saving beside the next
attempt's (one volume, the same step): the first, when it reaches `pause()`, starts the second
and waits until the second reaches its own `pause()`; the second waits there until the first
is done (`finish()`). What each wrote is then checked: neither may write into the other's files."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Interleaving:
    def __init__(self, second: Callable[[], Any]) -> None:
        #: What the second writer's call returned, or the exception it raised.
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._second, args=(second,))
        self.reached, self.first_done = threading.Event(), threading.Event()

    def _second(self, write: Callable[[], Any]) -> None:
        try:
            self.outcome.append(write())
        except Exception as exc:
            self.outcome.append(exc)

    def pause(self) -> None:
        """The second writer waits here for the first to be done; the first starts it here and
        waits for it to get this far."""
        if threading.current_thread() is self.thread:
            self.reached.set()
            assert self.first_done.wait(60)
        elif not self.reached.is_set():
            self.thread.start()
            assert self.reached.wait(60)

    def before(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call` with `pause()` first (a store's hashing of the files it wrote)."""

        def paused(*args: Any, **kwargs: Any) -> Any:
            self.pause()
            return call(*args, **kwargs)

        return paused

    def finish(self) -> None:
        """The first writer is done: the second goes on; wait for it."""
        self.first_done.set()
        self.thread.join(60)
