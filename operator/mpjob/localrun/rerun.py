"""A rerun of a local run that ended Failed on a configuration error.

A ConfigError (exit 43: the setup or the user's code is wrong, retrying cannot help) ends the job
Failed at once, as on a cluster. It asks the user to fix the setup, and what the run trained is
not wrong: the rerun of the same --out after the fix goes on from the newest checkpoint, in a new
attempt in the ConfigError attempt's precision and split, as a resume after a suspension does.
Every other ending stays as it ended (a rerun says so and runs nothing: `stops.ended_line`). The
settings a run's checkpoints hold to still bind (`paths.prepare` refuses a fix that changes them,
naming the field), and the rerun's attempt counts against runPolicy.maxAttempts as any other does.
"""

from __future__ import annotations

from pathlib import Path

from mpjob.planning import lifecycle as lc
from mpjob.planning.status import ConditionReason, ConditionType, failed_condition
from mpjob_contract.api import CheckpointStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason

#: The Failed condition's message once the rerun takes the job up again.
REOPENED = "run again with the same --out after its configuration error"


def reopens(status: MixedPrecisionJobStatus) -> bool:
    """Whether a rerun of the run `status` records goes on: it ended Failed, its newest attempt
    ConfigError (also when a rerun found no attempt left: that attempt is still the newest)."""
    newest = status.attempts[-1] if status.attempts else None
    return status.phase == "Failed" and newest is not None and newest.reason == Reason.CONFIG_ERROR


def reopen(plan: lc.Plan, spec: MixedPrecisionJobSpec, when: lc.When) -> None:
    """The Failed job taken up again (`reopens`): the next attempt, in the ConfigError attempt's
    precision and shape, from the newest checkpoint (the run's folder outlives its processes);
    Failed again, AttemptsExhausted, when runPolicy.maxAttempts leaves none."""
    status = plan.status
    status.completion_time, status.message = None, None
    lc.condition(plan, when, ConditionType.FAILED, False, ConditionReason.RESUMED, REOPENED)
    left = f"no attempt left to rerun: runPolicy.maxAttempts is {spec.run_policy.max_attempts}; raise it to go on"
    lc.go_on(plan, spec, when, outlive=True, none_left=left)


def rerun_line(name: str, root: Path, checkpoint: CheckpointStatus | None) -> str:
    """What the rerun says before its first attempt."""
    where = "starting over: no checkpoint" if checkpoint is None else f"from checkpoint step {checkpoint.step}"
    return f"rerunning {name} in {root} after its configuration error, {where}"


def fix_line(status: MixedPrecisionJobStatus) -> str | None:
    """What a run that failed on its configuration error says after its summary: how to go on
    once it is fixed, or, when a rerun found no attempt left, its Failed condition's message
    (raise runPolicy.maxAttempts), which no attempt's line holds; None when it did not."""
    failed = failed_condition(status)
    if not reopens(status) or failed is None:
        return None
    if failed.reason != Reason.CONFIG_ERROR:  # `reopen` found none left: the summary says only its reason
        return f"  rerun:  {failed.message}" if failed.message else None
    checkpoint = status.last_checkpoint
    then = "starts over: no checkpoint" if checkpoint is None else f"resumes from checkpoint step {checkpoint.step}"
    return f"  rerun:  fix the configuration error and run `mpjob run` again with the same --out; it {then}"
