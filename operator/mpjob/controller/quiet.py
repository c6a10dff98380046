"""Reads of what this operator may be refused for good: the Nodes, Kueue's objects, the GPU
nodes and pods an elastic job grows on. A refusal (403: a chart without the rule; 404: an API
that is not installed) is remembered and said once, and that kind is not asked again for
QUIET_SECONDS: an operator without the grant neither floods its log nor asks the API server
each tick."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException

from mpjob.controller.cluster import raw

log = logging.getLogger("mpjob.operator")
T = TypeVar("T")
#: Seconds a read refused for good is not asked again.
QUIET_SECONDS = 300.0


class QuietReads:
    """Reads of what this operator may be refused for good: a 403 (a chart without the rule) or
    a 404 (an API that is not installed) quiets reads of that kind for `quiet_seconds` (None
    without asking), said once in the log while the refusal lasts; any other error is a None
    this time."""

    def __init__(self, quiet_seconds: float = QUIET_SECONDS, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_seconds, self._clock = quiet_seconds, clock
        self._quiet_until: dict[str, float] = {}
        self._said: set[str] = set()  # the kinds refused, told once while it lasts

    def read(self, kind: str, call: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """`raw(call, ...)`, or None (refused now, or quiet after a refusal of `kind`)."""
        return self.ask(kind, lambda: raw(call, *args, **kwargs))

    def ask(self, kind: str, fetch: Callable[[], T]) -> T | None:
        """`fetch()`, or None (it raised an ApiException, or `kind` is quiet after a refusal)."""
        if self._clock() < self._quiet_until.get(kind, 0.0):
            return None
        try:
            answer = fetch()
        except ApiException as exc:
            if exc.status in (403, 404):
                self._quiet_until[kind] = self._clock() + self.quiet_seconds
                if kind not in self._said:
                    self._said.add(kind)
                    why = f"{exc.status} {exc.reason}"
                    log.warning("cannot read %s (%s): asked again every %.0f s", kind, why, self.quiet_seconds)
            return None
        self._said.discard(kind)
        return answer
