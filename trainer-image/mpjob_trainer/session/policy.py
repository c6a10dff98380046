"""The trainer's share of the fault policy (mpjob_contract.faults): what bad data and a loss
spike do in the attempt. The guard's settings say it (guard.onBadData, guard.spike.action)
unless the job's spec.faultPolicy has a rule on the fault, which then decides."""

from __future__ import annotations

from typing import Literal

from mpjob_contract.api import Guard
from mpjob_contract.faults import Fault, FaultAction
from mpjob_contract.policy import FaultPolicy

#: rollback: roll back and skip the spiking steps; end: end the attempt (the operator's rule on
#: LossSpike then falls back or fails the job); off: no spike detection.
OnSpike = Literal["rollback", "end", "off"]


def trainer_actions(guard: Guard, policy: FaultPolicy) -> tuple[bool, OnSpike]:
    """(skip bad data?, what a spike does) for this attempt."""
    bad_data = policy.decide(Fault.NON_FINITE_IN_FP32)
    skips = guard.on_bad_data == "skip" if bad_data.rule is None else bad_data.action is FaultAction.SKIP
    spike = policy.decide(Fault.LOSS_SPIKE)
    on_spike: OnSpike
    if spike.rule is None:
        on_spike = "rollback" if guard.spike.action == "rollback" else "off"
    else:
        on_spike = "rollback" if spike.action is FaultAction.ROLL_BACK else "end"
    return skips, on_spike
