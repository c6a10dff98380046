"""Waiting on conditions with timeouts (never sleep-and-hope)."""

from __future__ import annotations

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
