"""What an attempt skipped as bad data or loss spikes (guard.onBadData, guard.spike): status.skipped
and one Event per newly skipped step, from the trainer's termination report.

The trainer's quarantine is cumulative (checkpoints carry it), so the newest report holds every
skip the run kept; a step already in status.skipped is not announced twice. One function for
the operator and `mpjob run` alike (planning/lifecycle.conclude calls it).
"""

from __future__ import annotations

from mpjob.planning.status import ConditionReason
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.report import TerminationReport
from mpjob_contract.skipping import Skipped, SkippedStep, describe_ranges

#: The Event reason of a skipped step, by cause.
EVENT_REASONS = {"data": ConditionReason.DATA_SKIPPED, "spike": ConditionReason.LOSS_SPIKE}
WHY = {
    "data": "non-finite in fp32 too (bad data)",
    "spike": "finite loss spike (guard.spike)",
}


def newly_skipped(status: MixedPrecisionJobStatus, report: TerminationReport | None) -> list[SkippedStep]:
    """Record the report's skips in status.skipped; the steps it had not shown before."""
    if report is None or report.skipped is None:
        return []
    known = {(s.step, s.cause) for s in status.skipped.steps} if status.skipped is not None else set()
    fresh = [s for s in report.skipped.steps if (s.step, s.cause) not in known]
    status.skipped = merged(status.skipped, report.skipped)
    return fresh


def merged(before: Skipped | None, now: Skipped) -> Skipped:
    """The larger record wins (a resumed attempt may not yet know what a killed one skipped)."""
    if before is None or now.count >= before.count:
        return now
    return before


def message(step: SkippedStep) -> str:
    """'step 12 skipped: non-finite in fp32 too (bad data); samples 30' (an Event's message)."""
    samples = describe_ranges(step.samples) or "not named by the loop (the whole step)"
    return f"step {step.step} skipped: {WHY[step.cause]}; rolled back to the last good checkpoint; samples {samples}"
