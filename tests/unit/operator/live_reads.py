"""What one read of a running attempt's endpoint changes, as a reconcile takes it in
(`planning.observe`): the status fields to write and the Event that corrects its start step."""

from __future__ import annotations

from typing import Any

from mpjob.controller.progress import found_reading
from mpjob.planning.observe import changes, observe
from mpjob.planning.plan import Event
from mpjob_contract.api import MixedPrecisionJobStatus


def progress_patch(status: MixedPrecisionJobStatus, found: dict[str, Any]) -> dict[str, Any]:
    """The status fields to write for what a read found; empty when nothing changed."""
    return changes(status, observe(status, found_reading(found)).status)


def start_news(status: MixedPrecisionJobStatus, found: dict[str, Any]) -> Event | None:
    """The Event that corrects the running attempt's planned start step with the one its trainer
    reports (None: the same, or not known yet)."""
    return observe(status, found_reading(found)).news
