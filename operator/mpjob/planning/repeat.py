"""Two attempts in a row that fail the same way before their first step end the job.

A script that cannot start (a file that is not there, a module that fails to import, a
wrong argument) fails the same way on every attempt: retrying it spends every attempt of
runPolicy.maxAttempts, and the job's message for all that time is a generic retry. So an
infrastructure failure (the class that is otherwise retried in the same precision) ends the
job Failed when the attempt before it ended the same way and neither trained a step.

What counts, from the attempts' records (status.attempts, written from the termination
reports):
- "the same way": the same reason, exit code and message. The message is the trainer's own,
  or the one the launcher makes for a rank that left no report, which quotes the end of the
  rank's stderr (docs/launcher.md), so two different crashes do not read as one;
- "before its first step": the attempt's endStep equals its startStep. The report says where
  the attempt began (startStep, else the checkpoint the planner resumed it from) and where it
  ended (step). A report made for a rank that left none carries no progress (step 0): for a
  resumed attempt that reads as endStep < startStep, "unknown", and does not count.
Platform endings (evicted, deleted, node lost, preempted, suspended) never count: the job
did nothing wrong there.
"""

from __future__ import annotations

from collections.abc import Sequence

from mpjob_contract.api import AttemptStatus
from mpjob_contract.codes import FinishReason, Reason

#: The Finish reason (and Failed condition reason) of a job ended by this rule.
REPEATED_FAILURE = FinishReason.FAILED_BEFORE_FIRST_STEP
#: Endings this rule looks at: the ones retried in the same precision because the trainer (or
#: the user's command) failed, not the platform.
COUNTED = frozenset({Reason.INFRA_ERROR.value})


def before_first_step(attempt: AttemptStatus) -> bool:
    """Whether the attempt's record shows it ended where it began (no step trained)."""
    return attempt.end_step is not None and attempt.end_step == attempt.start_step


def repeated_early_failure(history: Sequence[AttemptStatus]) -> str | None:
    """The job's final message when its last two attempts failed the same way before their first
    step; None when the job should go on (`history`: the attempts so far, the ended one last)."""
    if len(history) < 2:
        return None
    before, last = history[-2], history[-1]
    for attempt in (before, last):
        if attempt.reason not in COUNTED or attempt.exit_code is None or not before_first_step(attempt):
            return None
    if (before.reason, before.exit_code, before.message) != (last.reason, last.exit_code, last.message):
        return None
    return (
        f"attempts {before.index} and {last.index} failed the same way before their first step "
        f"(exit {last.exit_code}, {last.reason}); not retried: {last.message}"
    )
