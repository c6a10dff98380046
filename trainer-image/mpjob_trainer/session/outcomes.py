"""What the data rung hands on instead of raising: the faults it recovers from (a suspect
non-finite loss, a loss spike), RolledBack and Rewrap, which only the SDK's edge raises (Session.end_step)
so that the loop is left and re-entered: a framework adapter's from the checkpoint RolledBack names,
a loop whose sharded model changed precision in place wrapped anew (Session.reentering)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mpjob_contract.faults import GuardRule
from mpjob_contract.report import CheckpointRef
from mpjob_contract.skipping import describe_steps
from mpjob_trainer.errors import NumericFault

if TYPE_CHECKING:
    from mpjob_trainer.session.rollback import Target


class SuspectSteps(NumericFault):
    """A non-finite loss below the guard's bound, replayed before it can do harm."""


class RolledBack(Exception):
    """The session was rolled back to the checkpoint `ref`: the loop re-enters from it (a
    framework adapter, DataRung.reenters). Not a NumericFault: no precision is given up."""

    def __init__(self, ref: CheckpointRef) -> None:
        super().__init__(f"rolled back to the checkpoint of step {ref.step}")
        self.ref = ref


class Rewrap(Exception):
    """The precision changed in place under a sharded model, whose MixedPrecisionPolicy is fixed
    when it is wrapped: the loop re-enters (Session.reentering), builds and wraps its model in the
    new precision, and its resume() loads `target`. Not a NumericFault: the change is made."""

    def __init__(self, target: Target) -> None:
        super().__init__(f"wrapped anew from the state of step {target.step}")
        self.target = target


class LossSpiked(NumericFault):
    """Finite losses above their window (guard.spike) at `steps`."""

    def __init__(self, steps: tuple[int, ...], detected_at: int) -> None:
        said = f"loss spike at step(s) {describe_steps(steps)} (detected at {detected_at})"  # counted from 1
        super().__init__(GuardRule.LOSS_SPIKE, said)
        self.steps = steps
