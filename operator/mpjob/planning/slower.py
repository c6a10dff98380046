"""F6 on the job: an `auto` attempt measured no low precision faster than fp32 by the margin on
its node, so it trains in fp32: the condition `AmpSlowerThanFp32`.

One rule for every place a measurement reaches the status: the operator's read of rank 0's
metrics and `mpjob run`'s `precisionMeasured` line (`planning/observe.py`), as soon as the
attempt measured, and its termination report (`planning/lifecycle.py`), which alone carries
it when no read caught the measurement. Whether AMP was slower is
`mpjob_contract.report.amp_slower`, the trainer's own rule. The condition is True from then
on (reason `Measured`, the step times in its message); its Warning Event is told once, the
first time: the condition in the status is the memory, so a later read, the report or an
operator that restarts tells nothing twice.
"""

from __future__ import annotations

from mpjob.planning import status as st
from mpjob.planning.plan import Event
from mpjob.planning.reported import step_times
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.launch import AUTO_MARGIN
from mpjob_contract.report import amp_slower

CONDITION = st.ConditionType.AMP_SLOWER_THAN_FP32.value


def update(
    status: MixedPrecisionJobStatus,
    chosen: str,
    seconds: dict[str, float | None],
    *,
    at: str | None = None,
    generation: int | None = None,
) -> Event | None:
    """Set the condition in `status` (in place) when a measurement of `seconds` that chose
    `chosen` shows AMP slower; the Warning Event when the condition is new."""
    if not amp_slower(chosen, seconds):
        return None
    shown = step_times(seconds)
    message = f"no low precision beat fp32 by {AUTO_MARGIN:.0%} per step on this node ({shown}): training in fp32"
    known = st.holds(status, CONDITION)
    st.set_condition(status, CONDITION, True, st.ConditionReason.MEASURED, message, at, generation)
    return None if known else Event("Warning", CONDITION, message)
