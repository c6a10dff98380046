"""Shared by tests and benchmarks: waiting on conditions with timeouts (never sleep-and-hope),
and a free loopback port."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2, message: str = "condition"
) -> T:
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # the API may be briefly unavailable; keep the last error
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    detail = f" (last error: {last_error!r})" if last_error else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}{detail}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
