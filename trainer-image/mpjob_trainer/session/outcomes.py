"""What the data rung hands on instead of raising: the faults it recovers from (a suspect
non-finite loss, a loss spike) and RolledBack, which only the SDK's edge raises (Session.end_step)
so that a framework adapter's loop is left and re-entered from the checkpoint it names."""

from __future__ import annotations

from mpjob_contract.faults import GuardRule
from mpjob_contract.report import CheckpointRef
from mpjob_trainer.errors import NumericFault


class SuspectSteps(NumericFault):
    """A non-finite loss below the guard's bound, replayed before it can do harm."""


class RolledBack(Exception):
    """The session was rolled back to the checkpoint `ref`: the loop re-enters from it (a
    framework adapter, DataRung.reenters). Not a NumericFault: no precision is given up."""

    def __init__(self, ref: CheckpointRef) -> None:
        super().__init__(f"rolled back to the checkpoint of step {ref.step}")
        self.ref = ref


class LossSpiked(NumericFault):
    """Finite losses above their window (guard.spike) at `steps`."""

    def __init__(self, steps: range, detected_at: int) -> None:
        super().__init__(
            GuardRule.LOSS_SPIKE, f"loss spike at steps {steps.start}-{steps.stop - 1} (detected at {detected_at})"
        )
        self.steps = steps
