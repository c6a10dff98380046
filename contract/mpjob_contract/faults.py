"""The fault policy as data: what happened (a Fault) -> what to do (a FaultAction).

One table, read by the trainer (skip bad data, roll a loss spike back, or end the attempt) and
by the operator (the next attempt: next precision, same precision, a smaller micro-batch, or
fail the job). A job may override it: `spec.faultPolicy.rules`, first match wins, the built-in
action after. `ACTIONS` says which actions each fault allows, the built-in one first; a rule
outside it is refused by the API server and `mpjob validate` alike (rules.FAULT_RULE_ALLOWED).

Names are the ones the status already uses: a Fault is an attempt's reason (codes.Reason), or
for a numeric fault the guard's rule that ended it (GuardRule: QualityDrift, LossSpike).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from mpjob_contract.codes import Reason


class GuardRule(StrEnum):
    """The trainer's rules that end a precision (a numeric fault's `rule`; metric labels too)."""

    MAX_NON_FINITE_LOSSES = "MaxNonFiniteLosses"
    MAX_CONSECUTIVE_OVERFLOWS = "MaxConsecutiveOverflows"
    LOSS_SCALE_COLLAPSED = "LossScaleCollapsed"
    STAGNATION = "Stagnation"
    QUALITY_DRIFT = "QualityDrift"
    LOSS_SPIKE = "LossSpike"


class Fault(StrEnum):
    NUMERIC_FAULT = "NumericFault"
    QUALITY_DRIFT = "QualityDrift"
    LOSS_SPIKE = "LossSpike"
    NON_FINITE_IN_FP32 = "NonFiniteInFp32"
    OUT_OF_DEVICE_MEMORY = "OutOfDeviceMemory"
    PREEMPTED = "Preempted"
    INFRA_ERROR = "InfraError"
    STALLED = "Stalled"


class FaultAction(StrEnum):
    #: The next precision of the ladder, from the last good checkpoint (operator).
    FALL_BACK = "FallBack"
    #: The same precision again, from the newest valid checkpoint (operator).
    RETRY = "Retry"
    #: The same precision with a smaller micro-batch: the same samples per step (operator).
    SMALLER_MICRO_BATCH = "SmallerMicroBatch"
    #: Quarantine the bad step's samples and go on in the attempt (trainer).
    SKIP = "Skip"
    #: Roll back to the last good state and skip the spiking steps (trainer).
    ROLL_BACK = "RollBack"
    #: End the job, naming the rule.
    FAIL = "Fail"


#: Each fault's allowed actions, its built-in action first.
ACTIONS: dict[Fault, tuple[FaultAction, ...]] = {
    Fault.NUMERIC_FAULT: (FaultAction.FALL_BACK, FaultAction.RETRY, FaultAction.FAIL),
    Fault.QUALITY_DRIFT: (FaultAction.FALL_BACK, FaultAction.FAIL),
    Fault.LOSS_SPIKE: (FaultAction.ROLL_BACK, FaultAction.FALL_BACK, FaultAction.FAIL),
    Fault.NON_FINITE_IN_FP32: (FaultAction.SKIP, FaultAction.FAIL),
    Fault.OUT_OF_DEVICE_MEMORY: (FaultAction.SMALLER_MICRO_BATCH, FaultAction.RETRY, FaultAction.FAIL),
    Fault.PREEMPTED: (FaultAction.RETRY, FaultAction.FAIL),
    Fault.INFRA_ERROR: (FaultAction.RETRY, FaultAction.FAIL),
    Fault.STALLED: (FaultAction.RETRY, FaultAction.FAIL),
}
#: An attempt's reason -> the fault it is (reasons not listed are not faults a policy rules on).
_FAULT_OF_REASON: dict[Reason, Fault] = {
    Reason.NUMERIC_FAULT: Fault.NUMERIC_FAULT,
    Reason.NON_FINITE_IN_FP32: Fault.NON_FINITE_IN_FP32,
    Reason.OUT_OF_DEVICE_MEMORY: Fault.OUT_OF_DEVICE_MEMORY,
    Reason.PREEMPTED: Fault.PREEMPTED,
    Reason.EVICTED: Fault.PREEMPTED,
    Reason.INFRA_ERROR: Fault.INFRA_ERROR,
    Reason.DELETED: Fault.INFRA_ERROR,
    Reason.NODE_LOST: Fault.INFRA_ERROR,
    Reason.STALLED: Fault.STALLED,
}
#: A numeric fault's guard rule that is a fault of its own.
_FAULT_OF_RULE: dict[str, Fault] = {
    GuardRule.QUALITY_DRIFT: Fault.QUALITY_DRIFT,
    GuardRule.LOSS_SPIKE: Fault.LOSS_SPIKE,
}


def allowed(fault: Fault, action: FaultAction) -> bool:
    return action in ACTIONS[fault]


def built_in(fault: Fault) -> FaultAction:
    """What is done about `fault` when no rule names it."""
    return ACTIONS[fault][0]


def fault_of(reason: Reason, rule: str | None = None) -> Fault | None:
    """The fault an attempt's ending is (None: not one a policy rules on, e.g. Succeeded)."""
    if reason == Reason.NUMERIC_FAULT and rule in _FAULT_OF_RULE:
        return _FAULT_OF_RULE[rule]
    return _FAULT_OF_REASON.get(reason)


@dataclass(frozen=True)
class Decision:
    action: FaultAction
    #: The index of the job's rule that decided (None: the built-in table).
    rule: int | None = None

    def names(self, fault: Fault) -> str:
        """Where the decision came from, for messages."""
        if self.rule is None:
            return f"the built-in policy ({fault.value}: {self.action.value})"
        return f"spec.faultPolicy.rules[{self.rule}] (fault: {fault.value}, action: {self.action.value})"


def decide(rules: Sequence[tuple[Fault, FaultAction]], fault: Fault) -> Decision:
    """The job's first rule on `fault`, else the built-in action."""
    for index, (named, action) in enumerate(rules):
        if named == fault:
            return Decision(action, index)
    return Decision(built_in(fault))
