"""What a run skipped as bad data or loss spikes (guard.onBadData, guard.spike): status.skipped
and one Event per newly listed step, from what the trainer reports, live (a read of its metrics
endpoint, or `mpjob run`'s event lines: planning/observe.py) or in its termination report at
the attempt's end (planning/lifecycle.conclude). One rule for all of them, `record`:

- the trainer's quarantine is cumulative (checkpoints carry it), so each record it shows holds
  every skip it knows; status.skipped takes what a record adds and never shrinks (a resumed
  attempt may not yet know what a killed one skipped and was seen to skip);
- the listing only grows, at its end, up to MAX_SKIPPED_ENTRIES steps: a step once listed stays
  listed, so it is announced once, whichever source showed it first, and an operator that
  restarts finds it in the status it reads back; a step past the bound is counted, not listed
  or announced;
- the counts are the largest any record showed (never a sum: the same skip seen live and in
  the report counts once), and never below the listing;
- a step the newer record also lists takes its entry there (the report, at the end, has the
  last word on what it lists).
"""

from __future__ import annotations

from mpjob.planning.plan import Event
from mpjob.planning.status import ConditionReason
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.skipping import MAX_SKIPPED_ENTRIES, Skipped, SkippedStep, describe_ranges, describe_steps

#: The Event reason of a skipped step, by cause.
EVENT_REASONS = {"data": ConditionReason.DATA_SKIPPED, "spike": ConditionReason.LOSS_SPIKE}
WHY = {
    "data": "non-finite in fp32 too (bad data)",
    "spike": "finite loss spike (guard.spike)",
}


def record(status: MixedPrecisionJobStatus, seen: Skipped | None) -> list[SkippedStep]:
    """Merge `seen` into status.skipped; the steps it newly lists (one Event each)."""
    if seen is None:
        return []
    before = status.skipped
    status.skipped = merged(before, seen)
    known = {_key(s) for s in before.steps} if before is not None else set()
    return [s for s in status.skipped.steps if _key(s) not in known]


def merged(before: Skipped | None, now: Skipped) -> Skipped:
    """`before` with what `now` adds (the rules in the module docstring)."""
    if before is None:
        before = Skipped()
    newer = {_key(s): s for s in now.steps}
    listed = [newer.get(_key(s), s) for s in before.steps]
    held = {_key(s) for s in listed}
    listed += [s for s in now.steps if _key(s) not in held][: MAX_SKIPPED_ENTRIES - len(listed)]
    count = max(before.count, now.count, len(listed))
    return Skipped(count=count, samples=max(before.samples, now.samples), steps=listed)


def _key(step: SkippedStep) -> tuple[int, str]:
    return step.step, step.cause


def announcement(step: SkippedStep) -> Event:
    """The Event that tells of a newly listed skipped step."""
    return Event("Warning", EVENT_REASONS[step.cause], message(step))


def message(step: SkippedStep) -> str:
    """'step 13 skipped: non-finite in fp32 too (bad data); samples 30' (an Event's message; the
    step counted from 1, status.skipped's index 12)."""
    samples = describe_ranges(step.samples) or "not named by the loop (the whole step)"
    back = "rolled back to the last good checkpoint"
    return f"step {describe_steps([step.step])} skipped: {WHY[step.cause]}; {back}; samples {samples}"
