"""Two attempts in a row that fail the same way at the same step end the job.

A script that cannot start (a file that is not there, a module that fails to import, a
wrong argument) fails the same way on every attempt, and so does a script that raises at
the same step whatever the attempt (a bug its data reaches there, a shape or key error): the
trainer cannot tell such an exception from an infrastructure fault (both end `InfraError`,
retried in the same precision), but the attempts' records can. Retrying it spends every
attempt of runPolicy.maxAttempts, and the job's message for all that time is a generic retry.
So an infrastructure failure ends the job Failed when the attempt before it ended the same
way at the same step.

What counts, from the attempts' records (status.attempts, written from the termination
reports):
- "the same way": the same reason, exit code and message. The message is the trainer's own
  (the exception's type and text), or the one the launcher makes for a rank that left no
  report, which quotes the end of the rank's stderr (docs/launcher.md), so two different
  crashes do not read as one;
- "at the same step": both attempts' endStep is the same, and the last one began at or before
  it (it trained up to that step again, or, resumed from a checkpoint there, failed before
  its first step). The report says where the attempt began (startStep, else the checkpoint
  the planner resumed it from) and where it ended (step). A report made for a rank that left
  none carries no progress (step 0): for a resumed attempt that reads as endStep < startStep,
  "unknown", and does not count. Both ending where they began is `FailedBeforeFirstStep`
  (a script that cannot start); any other step is `FailedAtTheSameStep`.
Platform endings (evicted, deleted, node lost, preempted, suspended) never count: the job
did nothing wrong there.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpjob_contract.api import AttemptStatus
from mpjob_contract.codes import FinishReason, Reason

#: The Finish reasons (and Failed condition reasons) of a job ended by this rule.
BEFORE_FIRST_STEP = FinishReason.FAILED_BEFORE_FIRST_STEP
AT_THE_SAME_STEP = FinishReason.FAILED_AT_THE_SAME_STEP
#: Endings this rule looks at: the ones retried in the same precision because the trainer (or
#: the user's command) failed, not the platform.
COUNTED = frozenset({Reason.INFRA_ERROR.value})


def before_first_step(attempt: AttemptStatus) -> bool:
    """Whether the attempt's record shows it ended where it began (no step trained)."""
    return attempt.end_step is not None and attempt.end_step == attempt.start_step


def end_known(attempt: AttemptStatus) -> bool:
    """Whether the attempt's record shows where it ended: at or past where it began (an endStep
    below its startStep is a report without progress: unknown)."""
    return attempt.end_step is not None and attempt.end_step >= attempt.start_step


def repeated_failure(history: Sequence[AttemptStatus]) -> tuple[FinishReason, str] | None:
    """The job's Finish reason and final message when its last two attempts failed the same way
    at the same step; None when the job should go on (`history`: the attempts so far, the ended
    one last)."""
    if len(history) < 2:
        return None
    before, last = history[-2], history[-1]
    for attempt in (before, last):
        if attempt.reason not in COUNTED or attempt.exit_code is None or not end_known(attempt):
            return None
    if _failure(before) != _failure(last):
        return None
    where = f"exit {last.exit_code}, {last.reason}"
    if before_first_step(before) and before_first_step(last):
        said = f"attempts {before.index} and {last.index} failed the same way before their first step ({where})"
        return BEFORE_FIRST_STEP, f"{said}; not retried: {last.message}"
    said = f"attempts {before.index} and {last.index} failed the same way at step {last.end_step} ({where})"
    return AT_THE_SAME_STEP, f"{said}; not retried: {last.message}"


def _failure(attempt: AttemptStatus) -> tuple[str | None, int | None, str | None, int | None]:
    """What makes two attempts' failures the same: their reason, exit code, message and end step."""
    return attempt.reason, attempt.exit_code, attempt.message, attempt.end_step
