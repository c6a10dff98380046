"""spec.faultPolicy: a job's own rules over the built-in fault table (mpjob_contract.faults)."""

from __future__ import annotations

from pydantic import Field, model_validator

from mpjob_contract import rules
from mpjob_contract.faults import Decision, Fault, FaultAction, decide
from mpjob_contract.wire import ApiModel

#: Rules a job may set (the table has seven faults; a few rules each is plenty).
MAX_FAULT_RULES = 16


# The fault's field was first named `on`, which YAML 1.1 (kubectl's reader and PyYAML) reads
# unquoted as the boolean true: `{on: NumericFault}` reached the API server as `{"true": ...}`.
# It is `fault` now; `on` is still read (quoted), so jobs stored with it keep their rules.
class FaultRule(ApiModel):
    """One rule: a fault and what to do about it."""

    fault: Fault | None = Field(
        None, description="What happened: the reason the status gives an attempt, or the guard rule. Required."
    )
    on: Fault | None = Field(
        None,
        description="The former name of `fault`, still read; YAML reads an unquoted on as true, so it needs "
        'quotes ("on": NumericFault). Write fault instead.',
    )
    action: FaultAction = Field(description="What to do about it (docs/fault-policy.md: what each fault allows).")

    @model_validator(mode="after")
    def _allowed(self) -> FaultRule:
        rules.FAULT_RULE_NAMES_ONE_FAULT.check(rules.wire_self(self))
        rules.FAULT_RULE_ALLOWED.check(rules.wire_self(self))
        return self

    @property
    def named(self) -> Fault:
        """The fault this rule is on, by whichever name the manifest gave it."""
        fault = self.fault if self.fault is not None else self.on
        assert fault is not None, "checked by FAULT_RULE_NAMES_ONE_FAULT"
        return fault


class FaultPolicy(ApiModel):
    """What the trainer and the operator do about a fault: the first rule on it, else the first on
    the fault that covers it (faults.decide), else the built-in."""

    rules: list[FaultRule] = Field(
        default_factory=list,
        max_length=MAX_FAULT_RULES,
        description="The first rule naming the fault decides; a guard rule no rule names (MaxNonFiniteLosses, "
        "MaxConsecutiveOverflows, LossScaleCollapsed, Stagnation) takes the first on NumericFault; faults no rule "
        "names keep the built-in action (docs/fault-policy.md).",
    )

    def decide(self, fault: Fault) -> Decision:
        return decide([(rule.named, rule.action) for rule in self.rules], fault)
