"""kopf.event finds kopf's event queue through context variables, which threads do not carry
over, and kopf sets them for the processing of each object, not at startup: the handlers
capture a context here and each reconcile (in a work queue thread) runs in a copy of it."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class KopfContext:
    def __init__(self) -> None:
        self._context = contextvars.copy_context()
        self._ready = threading.Event()

    def capture(self) -> None:
        """Keep the caller's context (a kopf handler's) for the reconciles to run in."""
        self._context = contextvars.copy_context()
        self._ready.set()

    def wait(self) -> None:
        """Until a kopf handler has captured its context."""
        self._ready.wait()

    def run(self, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`call` in a copy of the captured context."""
        return self._context.copy().run(call, *args, **kwargs)
