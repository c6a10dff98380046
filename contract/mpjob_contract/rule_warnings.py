"""Fault rules a spec holds that can never apply: warnings, not errors.

The first rule on a fault decides (FaultPolicy.decide), so a later rule on the same fault is
dead; a QualityDrift rule needs the quality gate (spec.validation.everySteps); a FallBack from
fp32 has no rung below it. Such jobs have always been accepted and run, and the operator
re-validates every stored spec at each reconcile, so refusing them would fail running jobs
after an upgrade: `mpjob validate` and `mpjob run` print these, the operator posts them as one
Warning Event per generation.
"""

from __future__ import annotations

from mpjob_contract.faults import Fault, FaultAction
from mpjob_contract.spec import MixedPrecisionJobSpec

#: The Event reason of the operator's warning.
REASON = "FaultRuleNeverApplies"


def never_applying(spec: MixedPrecisionJobSpec) -> list[tuple[str, str]]:
    """(field below spec, why it never applies) for each fault rule that can never decide anything."""
    found: list[tuple[str, str]] = []
    first: dict[Fault, int] = {}
    for index, rule in enumerate(spec.fault_policy.rules):
        field, fault = f"faultPolicy.rules[{index}]", rule.named
        if fault in first:
            found.append((field, f"never applies: rules[{first[fault]}] is on {fault} too and comes first"))
            continue
        first[fault] = index
        if fault == Fault.QUALITY_DRIFT and spec.validation.every_steps == 0:
            why = "never applies: QualityDrift comes only from the quality gate, and spec.validation.everySteps is 0"
            found.append((field, why))
        elif rule.action == FaultAction.FALL_BACK and spec.precision.mode == "fp32":
            why = "never applies: FallBack needs a precision below the starting one, and precision.mode fp32 has none"
            found.append((field, why))
    return found


def messages(spec: MixedPrecisionJobSpec) -> list[str]:
    """Each warning as `spec.<field>: why`: the operator's Event message, a terminal line's end."""
    return [f"spec.{field}: {why}" for field, why in never_applying(spec)]


def warning_lines(spec: MixedPrecisionJobSpec, source: str = "") -> list[str]:
    """The warnings as lines for a terminal: `source: warning: spec.<field>: why`."""
    where = f"{source}: " if source else ""
    return [f"{where}warning: {message}" for message in messages(spec)]
