"""spec.faultPolicy: a job's own rules over the built-in fault table (mpjob_contract.faults)."""

from __future__ import annotations

from pydantic import Field, model_validator

from mpjob_contract import rules
from mpjob_contract.faults import Decision, Fault, FaultAction, decide
from mpjob_contract.wire import ApiModel

#: Rules a job may set (the table has seven faults; a few rules each is plenty).
MAX_FAULT_RULES = 16


class FaultRule(ApiModel):
    on: Fault = Field(description="What happened: the reason the status gives an attempt, or the guard rule.")
    action: FaultAction = Field(description="What to do about it (docs/fault-policy.md: what each fault allows).")

    @model_validator(mode="after")
    def _allowed(self) -> FaultRule:
        rules.FAULT_RULE_ALLOWED.check(rules.wire_self(self))
        return self


class FaultPolicy(ApiModel):
    """What the trainer and the operator do about a fault: the first rule on it, else the built-in."""

    rules: list[FaultRule] = Field(
        default_factory=list,
        max_length=MAX_FAULT_RULES,
        description="Checked in order, the first whose `on` matches decides; faults no rule names keep the "
        "built-in action (docs/fault-policy.md).",
    )

    def decide(self, fault: Fault) -> Decision:
        return decide([(rule.on, rule.action) for rule in self.rules], fault)
