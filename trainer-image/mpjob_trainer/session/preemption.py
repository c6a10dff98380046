"""PreemptionFlag: SIGTERM asks the run to stop at the next step boundary, not now.

Kubernetes sends SIGTERM before it kills a pod (eviction, node drain, Kueue preemption,
`runPolicy.suspend`). Dying on the spot would lose the work since the last checkpoint, so
the handler only raises a flag; `Session.end_step` sees it (alone: every step, host-only;
under DDP: at the next interval, all-reduced so every rank stops at the same step), writes
a checkpoint and exits 44, and the next attempt resumes in the same precision. At the last step
nothing is left to resume: the run ends Succeeded on its final checkpoint.
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class PreemptionFlag:
    def __init__(self) -> None:
        self.raised = False
        self._previous: Any = None

    def install(self) -> None:
        """Catch SIGTERM (only the main thread may install signal handlers)."""
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)

    def restore(self) -> None:
        """Give SIGTERM back to whoever handled it before the run."""
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def reclaim(self) -> None:
        """Handle SIGTERM again after a framework replaced this handler with its own; `restore`
        still gives back the handler from before the run."""
        if self._previous is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.raised = True
