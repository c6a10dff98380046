"""Checkpoints that stop coming while training goes on: the `CheckpointsFailing` condition.

A save that fails (a bucket gone, a full volume) or is skipped (a numerically unhealthy window)
does not stop training: a step is still progress and the next save tries again. But every step
past the newest checkpoint is one a fault, preemption or fallback trains again, and a user who
sees only steps moving learns it at the next fault. So, one rule for both sources of live
progress (`planning/observe.py` applies it to the operator's reads and `mpjob run`'s lines):

- the run is lapsed while its step is `LAPSED_INTERVALS` or more intervals of
  checkpoint.everySteps past its newest checkpoint (status.lastCheckpoint; none: step 0);
- the condition `CheckpointsFailing` is True while lapsed (reason `CheckpointsFailing`), and
  False (reason `CheckpointsCurrent`) once a reading shows the run within that distance again
  (a save reported, or an attempt resumed from a checkpoint close to where it trains);
- each flip is told once (a Warning Event on lapsing, a Normal one on catching up: the
  condition in the status is the memory, so an operator that restarts tells nothing twice);
  the status never gains the condition while it was never lapsed;
- a checkpoint a trainer's termination report names (its ending, or what its stopped pods
  reported late: the one written on SIGTERM) catches up as a reading's does (`caught_up`), for no
  reading comes to a job that is suspended, ended or waits for its next attempt's pods; a report
  only clears the condition: it is raised by readings alone, while training goes on.

No limit stops the run (none is promised): the runbook CheckpointFailing says what to do.
"""

from __future__ import annotations

from mpjob.planning import status as st
from mpjob.planning.plan import Event, Plan
from mpjob_contract.api import MixedPrecisionJobStatus

#: Save intervals in a row without a checkpoint before the run is lapsed (an asynchronous save is
#: reported up to one interval late, so two would flap on a slow store).
LAPSED_INTERVALS = 3
CONDITION = LAPSED = st.ConditionType.CHECKPOINTS_FAILING.value
CURRENT = "CheckpointsCurrent"


def lapsed(status: MixedPrecisionJobStatus, every_steps: int) -> bool:
    """Whether `status`'s step is LAPSED_INTERVALS save intervals or more past its newest checkpoint."""
    newest = status.last_checkpoint.step if status.last_checkpoint is not None else 0
    return status.step - newest >= LAPSED_INTERVALS * every_steps


def held(status: MixedPrecisionJobStatus) -> bool:
    """Whether `status` holds the condition as True."""
    return st.holds(status, CONDITION)


def update(status: MixedPrecisionJobStatus, every_steps: int, at: str | None = None) -> Event | None:
    """Flip `status`'s condition by the rule (in place); the Event a flip earns, None when
    nothing flipped."""
    now, before = lapsed(status, every_steps), held(status)
    if now == before:
        return None
    newest = status.last_checkpoint.step if status.last_checkpoint is not None else None
    since = f"checkpoint step {newest}" if newest is not None else "no checkpoint yet"
    behind = status.step - (newest or 0)
    if now:
        message = (
            f"no checkpoint for {behind} step(s) ({since}, step {status.step} now; checkpoint.everySteps "
            f"{every_steps}): saves are failing or skipped (the trainer's checkpointFailed lines say why); "
            f"training goes on, a fault now trains those steps again"
        )
        kind, reason = "Warning", LAPSED
    else:
        message = f"checkpoints current again: {since}, {behind} step(s) before step {status.step}"
        kind, reason = "Normal", CURRENT
    st.set_condition(status, CONDITION, now, reason, message, at=at)
    return Event(kind, reason, message)


def caught_up(plan: Plan, every_steps: int, at: str | None) -> None:
    """Clear the plan's condition, with its Event, where the status holds it but is no longer
    lapsed: a report's checkpoint (`planning/reported.py`) caught up where no reading said so."""
    if held(plan.status) and not lapsed(plan.status, every_steps):
        plan.events.extend(e for e in [update(plan.status, every_steps, at)] if e is not None)
