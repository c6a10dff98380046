"""The fault policy as data: what happened (a Fault) -> what to do (a FaultAction).

One table, read by the trainer (skip bad data, roll a loss spike back, or end the attempt) and
by the operator (the next attempt: next precision, same precision, a smaller micro-batch, or
fail the job). A job may override it: `spec.faultPolicy.rules`, the most specific rule first (one
naming the fault itself, else one naming the fault that covers it), the first of them in order,
the built-in action after (`decide`). `ACTIONS` says which actions each fault allows, the
built-in one first; a rule outside it is refused by the API server and `mpjob validate` alike
(rules.FAULT_RULE_ALLOWED).

Names are the ones the status already uses: a Fault is an attempt's reason (codes.Reason), or
for a numeric fault the guard's rule that ended it (GuardRule). QualityDrift and LossSpike are
faults of their own; NumericFault covers the other four (`COVERED_BY`), which a rule may also
name one by one.
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
    MAX_NON_FINITE_LOSSES = GuardRule.MAX_NON_FINITE_LOSSES.value
    MAX_CONSECUTIVE_OVERFLOWS = GuardRule.MAX_CONSECUTIVE_OVERFLOWS.value
    LOSS_SCALE_COLLAPSED = GuardRule.LOSS_SCALE_COLLAPSED.value
    STAGNATION = GuardRule.STAGNATION.value
    QUALITY_DRIFT = "QualityDrift"
    LOSS_SPIKE = "LossSpike"
    NON_FINITE_IN_FP32 = "NonFiniteInFp32"
    OUT_OF_DEVICE_MEMORY = "OutOfDeviceMemory"
    PREEMPTED = "Preempted"
    INFRA_ERROR = "InfraError"
    STALLED = "Stalled"
    OOM_KILLED = "OOMKilled"


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


#: A guard rule's fault -> the broader fault that covers it: a rule naming the broader fault
#: decides for it when none names it (the guard rules NumericFault always stood for).
COVERED_BY: dict[Fault, Fault] = {
    Fault.MAX_NON_FINITE_LOSSES: Fault.NUMERIC_FAULT,
    Fault.MAX_CONSECUTIVE_OVERFLOWS: Fault.NUMERIC_FAULT,
    Fault.LOSS_SCALE_COLLAPSED: Fault.NUMERIC_FAULT,
    Fault.STAGNATION: Fault.NUMERIC_FAULT,
}
_NUMERIC_ACTIONS = (FaultAction.FALL_BACK, FaultAction.RETRY, FaultAction.FAIL)
#: Each fault's allowed actions, its built-in action first (a covered fault's: its cover's).
ACTIONS: dict[Fault, tuple[FaultAction, ...]] = {
    Fault.NUMERIC_FAULT: _NUMERIC_ACTIONS,
    **dict.fromkeys(COVERED_BY, _NUMERIC_ACTIONS),
    Fault.QUALITY_DRIFT: (FaultAction.FALL_BACK, FaultAction.FAIL),
    Fault.LOSS_SPIKE: (FaultAction.ROLL_BACK, FaultAction.FALL_BACK, FaultAction.FAIL),
    Fault.NON_FINITE_IN_FP32: (FaultAction.SKIP, FaultAction.FAIL),
    Fault.OUT_OF_DEVICE_MEMORY: (FaultAction.SMALLER_MICRO_BATCH, FaultAction.RETRY, FaultAction.FAIL),
    Fault.PREEMPTED: (FaultAction.RETRY, FaultAction.FAIL),
    Fault.INFRA_ERROR: (FaultAction.RETRY, FaultAction.FAIL),
    Fault.STALLED: (FaultAction.RETRY, FaultAction.FAIL),
    #: The host's memory limit: the same attempt again meets the same limit, unless what filled
    #: it comes and goes (data loader workers, a neighbour on a node without limits).
    Fault.OOM_KILLED: (FaultAction.FAIL, FaultAction.RETRY),
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
    Reason.OOM_KILLED: Fault.OOM_KILLED,
}
#: A numeric fault's guard rule -> its fault: each is one by the same name.
_FAULT_OF_RULE: dict[str, Fault] = {rule.value: Fault(rule.value) for rule in GuardRule}


def allowed(fault: Fault, action: FaultAction) -> bool:
    return action in ACTIONS[fault]


def built_in(fault: Fault) -> FaultAction:
    """What is done about `fault` when no rule names it."""
    return ACTIONS[fault][0]


def fault_of(reason: Reason, rule: str | None = None) -> Fault | None:
    """The fault an attempt's ending is (None: not one a policy rules on, e.g. Succeeded): a
    numeric fault's is the guard rule that ended it, when its report names one (`decide` lets a
    rule on NumericFault cover it)."""
    if reason == Reason.NUMERIC_FAULT and rule in _FAULT_OF_RULE:
        return _FAULT_OF_RULE[rule]
    return _FAULT_OF_REASON.get(reason)


@dataclass(frozen=True)
class Decision:
    action: FaultAction
    #: The fault the deciding rule names (the built-in table: the fault decided on).
    fault: Fault
    #: The index of the job's rule that decided (None: the built-in table).
    rule: int | None = None

    def names(self) -> str:
        """Where the decision came from, for messages: the rule as the job wrote it."""
        if self.rule is None:
            return f"the built-in policy ({self.fault.value}: {self.action.value})"
        return f"spec.faultPolicy.rules[{self.rule}] (fault: {self.fault.value}, action: {self.action.value})"


def decide(rules: Sequence[tuple[Fault, FaultAction]], fault: Fault) -> Decision:
    """The job's first rule on `fault` itself, else its first on the fault that covers it
    (COVERED_BY: a rule on MaxConsecutiveOverflows beats one on NumericFault, in either order),
    else the built-in action."""
    for named in (fault, COVERED_BY.get(fault)):
        for index, (on, action) in enumerate(rules):
            if on == named:
                return Decision(action, on, index)
    return Decision(built_in(fault), fault)
