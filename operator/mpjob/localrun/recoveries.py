"""How long each recovery took, as `mpjob run` sees it in the trainer's lines:
`attempts[].recoverySeconds` from the fault's detection until the next attempt has its state
back and takes its first step. In place, the trainer measures it (`precisionChanged`); after a
restart, it is the time from the ended attempt's `fault` line to the next attempt's `resume`
(or `freshStart`) line: the process start, imports, model build and checkpoint load. Only the
attempt right after the fault: one that follows an attempt that ended before it resumed (a crash)
recovers from that ending, which its trainer clocks itself (its launch's recoveringSince, as on a
cluster) and reports."""

from __future__ import annotations

from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobStatus


class RecoveryClock:
    def __init__(self) -> None:
        #: The attempt whose fault was seen last, and when (the trainer's clock).
        self._fault: tuple[int, float] | None = None

    def seen(self, status: MixedPrecisionJobStatus, index: int, event: events.TrainerEvent) -> None:
        """A line of attempt `index`: a fault starts the clock, a later attempt's resume stops it."""
        if isinstance(event, events.Fault) and event.time is not None:
            self._fault = (index, event.time)
            return
        if not isinstance(event, events.Resume | events.FreshStart) or event.time is None or self._fault is None:
            return
        faulted, at = self._fault
        entry = next((a for a in status.attempts if a.index == index), None)
        if index == faulted + 1 and entry is not None and entry.recovery_seconds is None:
            entry.recovery_seconds = round(max(0.0, event.time - at), 3)
        if index > faulted:  # the fault's next attempt resumed, or ended before it could (a crash)
            self._fault = None
