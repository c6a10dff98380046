"""Fault rules a spec holds that can never apply, and why a guard check never fires for a spec.

The first rule on a fault decides (FaultPolicy.decide). A NumericFault rule needs a guard rule it
covers that no rule names and that can fire; a QualityDrift rule a quality gate that can fire, a
LossSpike rule a spike window the run fills, a Stagnation rule a stagnation check that can fire, a
MaxConsecutiveOverflows or LossScaleCollapsed rule an fp16 rung, the one with a GradScaler; a
FallBack needs a rung below. Each "never fires" reason is decided here once, and both the rules'
warnings and the settings' (spec_warnings.idle_settings) word it from here.
"""

from __future__ import annotations

from collections.abc import Callable

from mpjob_contract.faults import COVERED_BY, Fault, FaultAction
from mpjob_contract.spec import DRIFT_IN_A_ROW, MixedPrecisionJobSpec
from mpjob_contract.vocabulary import LOSS_SCALED

#: The guard rules that watch the loss scale: they end only an attempt that trains with one.
SCALE_RULES = (Fault.MAX_CONSECUTIVE_OVERFLOWS, Fault.LOSS_SCALE_COLLAPSED)


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
        if fault == Fault.NUMERIC_FAULT and (left := nothing_left_to_cover(spec)) is not None:
            found.append((field, f"never applies: NumericFault decides only a guard rule no rule names, and {left}"))
        elif fault == Fault.QUALITY_DRIFT and (gate := gate_never_fires(spec)) is not None:
            found.append((field, f"never applies: QualityDrift comes only from the quality gate, and {gate}"))
        elif fault == Fault.LOSS_SPIKE and (unjudged := spikes_never_judged(spec)) is not None:
            found.append((field, f"never applies: LossSpike comes only from the spike check, and {unjudged}"))
        elif fault == Fault.STAGNATION and (stuck := stagnation_never_fires(spec)) is not None:
            found.append((field, f"never applies: Stagnation comes only from the stagnation check, and {stuck}"))
        elif fault in SCALE_RULES and (unscaled := never_loss_scaled(spec)) is not None:
            found.append((field, f"never applies: {fault} comes only from fp16's GradScaler, and {unscaled}"))
        elif rule.action == FaultAction.FALL_BACK and (rung := no_rung_below(spec)) is not None:
            found.append((field, f"never applies: FallBack needs a precision below the starting one, and {rung}"))
    return found


def nothing_left_to_cover(spec: MixedPrecisionJobSpec) -> str | None:
    """Why a rule on NumericFault decides nothing, or None: each guard rule it covers is named by
    a rule of its own (which decides for it wherever each stands, faults.decide) or never fires
    for this spec (NEVER_FIRES; maxNonFiniteLosses is at least 1, so that one always can)."""
    first: dict[Fault, int] = {}
    for index, rule in enumerate(spec.fault_policy.rules):
        first.setdefault(rule.named, index)
    named = [f"rules[{first[fault]}] ({fault})" for fault in COVERED_BY if fault in first]
    idle: dict[str, list[str]] = {}  # why -> the unnamed guard rules it silences
    for fault in (fault for fault in COVERED_BY if fault not in first):
        if (never := NEVER_FIRES.get(fault)) is None or (why := never(spec)) is None:
            return None
        idle.setdefault(why, []).append(fault)
    names = f"{', '.join(named)} name{'' if len(named) > 1 else 's'}"
    if not idle:
        return f"{names} all four it covers"
    silent = [
        f"{' and '.join(faults)} never fire{'' if len(faults) > 1 else 's'} ({why})" for why, faults in idle.items()
    ]
    return f"{'; '.join(silent)}; {names} the rest"  # MaxNonFiniteLosses, always named here


def no_rung_below(spec: MixedPrecisionJobSpec) -> str | None:
    """Why no attempt can ever fall back (nothing below the first precision), or None."""
    if spec.precision.mode == "fp32":
        return "precision.mode fp32 has none"
    if not spec.precision.fallback:
        return "precision.fallback is empty"
    return None


def gate_never_fires(spec: MixedPrecisionJobSpec) -> str | None:
    """Why the quality gate can never end a precision (QualityDrift), or None. It evaluates at
    each multiple of validation.everySteps up to training.steps, and an attempt makes at most
    those evaluations: fewer than DRIFT_IN_A_ROW can never be that many in a row."""
    every, steps = spec.validation.every_steps, spec.training.steps
    if every == 0:
        return "spec.validation.everySteps is 0"
    if every > steps:
        return f"validation.everySteps={every} is more than training.steps={steps} (it never evaluates)"
    if (made := steps // every) < DRIFT_IN_A_ROW:
        return (
            f"validation.everySteps={every} evaluates {made} time{'' if made == 1 else 's'} in "
            f"training.steps={steps}, and "
            f"QualityDrift needs {DRIFT_IN_A_ROW} evaluations in a row over validation.maxLossDelta"
        )
    return None


def never_loss_scaled(spec: MixedPrecisionJobSpec) -> str | None:
    """Why no attempt ever trains with a GradScaler (LOSS_SCALED attempts alone do), or None. The
    attempts walk precision.mode then its fallback rungs (a re-promotion goes back up them); an
    `auto` mode is measured on the node and may become fp16 there, so it never says."""
    precision = spec.precision
    if precision.mode == "auto" or LOSS_SCALED in [precision.mode, *precision.fallback]:
        return None
    return (
        f"no attempt trains {LOSS_SCALED}: precision.mode is {precision.mode} and precision.fallback is "
        f"[{', '.join(precision.fallback)}]"
    )


def spikes_never_judged(spec: MixedPrecisionJobSpec) -> str | None:
    """Why no loss of the run is ever judged a spike, or None. The check takes the mean and
    deviation of guard.spike.window accepted losses, one a step, and judges none before it is full."""
    window, steps = spec.precision.guard.spike.window, spec.training.steps
    if window < steps:
        return None
    return (
        f"precision.guard.spike.window={window} is not below training.steps={steps}: the window of losses "
        "a spike is judged against is never full, so no loss is ever judged"
    )


def stagnation_never_fires(spec: MixedPrecisionJobSpec) -> str | None:
    """Why the guard's stagnation check never ends a precision, or None (it can)."""
    if spec.precision.guard.stagnation_steps == 0:
        return "precision.guard.stagnationSteps is 0 (off)"
    return stagnation_past_end(spec)


def stagnation_past_end(spec: MixedPrecisionJobSpec) -> str | None:
    """Why a stagnation check that is on never fires (it needs more steps than the run has), or None."""
    stagnation, steps = spec.precision.guard.stagnation_steps, spec.training.steps
    if stagnation == 0 or stagnation < steps:
        return None
    return (
        f"precision.guard.stagnationSteps={stagnation} is not below training.steps={steps}: no loss stays "
        "stuck that many steps in the run, the check never ends a precision"
    )


#: Why a guard rule NumericFault covers never fires for a spec, or None (it can): those that can
#: be silenced by the spec (MaxNonFiniteLosses cannot: guard.maxNonFiniteLosses >= 1).
NEVER_FIRES: dict[Fault, Callable[[MixedPrecisionJobSpec], str | None]] = {
    Fault.MAX_CONSECUTIVE_OVERFLOWS: never_loss_scaled,
    Fault.LOSS_SCALE_COLLAPSED: never_loss_scaled,
    Fault.STAGNATION: stagnation_never_fires,
}
