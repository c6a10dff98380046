"""Settings a spec holds that will not do what they say: warnings, not errors.

Only settings certainly dead for the spec as written (never a guess about the node or the run):
a fault rule that can never apply (rule_warnings.never_applying), and
a setting whose figure the run can never reach (checkpoint.everySteps, validation.everySteps,
precision.repromoteAfterSteps, precision.guard.stagnationSteps, the builtin loop's training.warmupSteps, a
precision.lossScale.growthInterval other than its default and a guard.spike.window, against
training.steps; a guard.minLossScale above the fp16 loss scale at the guard's first read). Not
elastic.minWorkers equal to workers: such a job never shrinks, yet elastic still acts (it
changes precision by new attempts, not in place, and waits for room as AwaitingWorkers). Such
jobs have always been accepted and run, and the operator re-validates every stored spec at each
reconcile, so refusing them would fail running jobs after an upgrade: `mpjob validate` and
`mpjob run` print these, the operator posts each as one Warning Event per generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mpjob_contract.faults import Fault
from mpjob_contract.pod_labels import APP_NAME_VALUE, MANAGED_BY_VALUE, replaced_labels
from mpjob_contract.precision import LossScale
from mpjob_contract.rule_warnings import (
    gate_never_fires,
    never_applying,
    no_rung_below,
    spikes_never_judged,
    stagnation_past_end,
)
from mpjob_contract.spec import MixedPrecisionJobSpec
from mpjob_contract.storage_warnings import checkpoints_in_pod
from mpjob_contract.vocabulary import LOSS_SCALED


class WarningReason(StrEnum):
    """The operator's Event reason of a warning."""

    FAULT_RULE_NEVER_APPLIES = "FaultRuleNeverApplies"  # a spec.faultPolicy.rules entry
    SPEC_NEVER_APPLIES = "SpecNeverApplies"  # any other setting
    CHECKPOINTS_IN_POD = "CheckpointsInPod"  # recoveries of its own that start over (storage_warnings)


@dataclass(frozen=True)
class SpecWarning:
    field: str  # below spec, as the manifest names it: checkpoint.everySteps
    why: str  # what happens: the values and their effect
    reason: WarningReason

    @property
    def message(self) -> str:
        """`spec.<field>: why`: the operator's Event message, a terminal line's end."""
        return f"spec.{self.field}: {self.why}"

    def line(self, source: str = "") -> str:
        """The warning as a terminal line: `source: warning: spec.<field>: why`."""
        return f"{source}: warning: {self.message}" if source else f"warning: {self.message}"


def spec_warnings(spec: MixedPrecisionJobSpec, *, in_pods: bool = True) -> list[SpecWarning]:
    """Every warning the spec earns: its fault rules' first, then its other settings', then (the
    job running in pods: `in_pods`; `mpjob run` keeps checkpoints on disk) its checkpoints'."""
    rules = [SpecWarning(f, why, WarningReason.FAULT_RULE_NEVER_APPLIES) for f, why in never_applying(spec)]
    idle = [SpecWarning(f, why, WarningReason.SPEC_NEVER_APPLIES) for f, why in idle_settings(spec)]
    lost = checkpoints_in_pod(spec) if in_pods else None
    fp8 = _fp8_without_gpu(spec) if in_pods else None
    return (
        rules
        + idle
        + ([SpecWarning("precision.mode", fp8, WarningReason.SPEC_NEVER_APPLIES)] if fp8 else [])
        + ([SpecWarning("checkpoint", lost, WarningReason.CHECKPOINTS_IN_POD)] if lost else [])
    )


def _fp8_without_gpu(spec: MixedPrecisionJobSpec) -> str | None:
    """A CPU job's pods get no GPU (the operator hides the node's: mpjob.builders.devices), and
    fp8 needs fp8 tensor cores unless emulated: its first attempt is certainly a ConfigError. Only
    `mode: fp8` starts there (`auto` measures fp8 on GPUs only); `mpjob run` trains on the
    machine's devices whatever gpusPerWorker says, so it is not warned."""
    if spec.precision.mode != "fp8" or spec.resources.gpus_per_worker > 0 or spec.precision.fp8.emulate:
        return None
    return (
        "precision.mode=fp8 with resources.gpusPerWorker=0: the pods get no GPU, and fp8 needs one of compute "
        "capability >= 8.9, so the first attempt ends ConfigError and the job fails; ask for a GPU, or set "
        "precision.fp8.emulate: true (fp8 emulated on the CPU: for tests, not faster)"
    )


def warning_lines(spec: MixedPrecisionJobSpec, source: str = "") -> list[str]:
    """The warnings of a job in pods as lines for a terminal: `source: warning: spec.<field>: why`."""
    return [warning.line(source) for warning in spec_warnings(spec)]


def idle_settings(spec: MixedPrecisionJobSpec) -> list[tuple[str, str]]:
    """(field below spec, what happens) for each setting other than the fault rules that the run
    can never act on as it says."""
    found = [
        ("checkpoint.everySteps", _checkpoints(spec)),
        ("validation.everySteps", _quality_gate(spec)),
        ("precision.repromoteAfterSteps", _repromotion(spec)),
        ("precision.guard.stagnationSteps", stagnation_past_end(spec)),
        ("training.warmupSteps", _warmup(spec)),
        ("precision.lossScale.growthInterval", _scale_growth(spec)),
        ("precision.guard.spike.window", _spike_window(spec)),
        ("precision.guard.minLossScale", _scale_floor(spec)),
        ("template.labels", _labels_replaced(spec)),
    ]
    return [(field, why) for field, why in found if why is not None]


def _checkpoints(spec: MixedPrecisionJobSpec) -> str | None:
    every, steps = spec.checkpoint.every_steps, spec.training.steps
    if every < steps:
        return None
    than = "more than" if every > steps else "equal to"
    return (
        f"checkpoint.everySteps={every} is {than} training.steps={steps}: no checkpoint before the last step "
        "(but one a stop writes), so a fault starts the next attempt over from step 0"
    )


def _quality_gate(spec: MixedPrecisionJobSpec) -> str | None:
    if spec.validation.every_steps == 0 or (gate := gate_never_fires(spec)) is None:
        return None  # off as written, or it can fire
    return f"{gate}: the quality gate never ends a precision"


def _repromotion(spec: MixedPrecisionJobSpec) -> str | None:
    """Why a fallback attempt can never go back up. It does at a checkpoint (a multiple of
    checkpoint.everySteps) before the last step, with at least repromoteAfterSteps clean steps
    behind it, counted from the attempt's start step (0 at the lowest)."""
    after, steps, every = spec.precision.repromote_after_steps, spec.training.steps, spec.checkpoint.every_steps
    if after == 0:
        return None
    if (rung := no_rung_below(spec)) is not None:
        return f"precision.repromoteAfterSteps={after} never re-promotes: no attempt falls back, {rung}"
    if spec.precision.max_repromotions == 0:
        return f"precision.repromoteAfterSteps={after} never re-promotes: precision.maxRepromotions is 0"
    if after >= steps:
        return (
            f"precision.repromoteAfterSteps={after} is not below training.steps={steps}: no attempt has that "
            "many clean steps before the last step, it never re-promotes"
        )
    first = -(-after // every) * every  # the first checkpoint step with `after` steps behind it
    if first < steps:
        return None
    return (
        f"precision.repromoteAfterSteps={after} never re-promotes: it goes back up at a checkpoint "
        f"(checkpoint.everySteps={every}) before the last step, and the first with {after} steps behind it, "
        f"step {first}, is not below training.steps={steps}"
    )


def _warmup(spec: MixedPrecisionJobSpec) -> str | None:
    """The builtin loop (task.builtin, task.module; a task.command may ignore warmupSteps) warms
    the learning rate up linearly over warmupSteps applied steps, then decays it (cosine)."""
    warmup, steps, peak = spec.training.warmup_steps, spec.training.steps, spec.training.learning_rate
    if spec.task.command is not None or warmup < steps:
        return None
    if warmup == steps:
        reached = f"reaches training.learningRate={peak:g} only at the last step"
    else:
        reached = f"never reaches training.learningRate={peak:g} (at most {peak * steps / warmup:.3g})"
    return (
        f"training.warmupSteps={warmup} is not below training.steps={steps}: the learning rate rises the "
        f"whole run, {reached}, and never decays (a warm-up below training.steps leaves steps to decay in)"
    )


def _scale_growth(spec: MixedPrecisionJobSpec) -> str | None:
    """The fp16 loss scale grows after growthInterval clean steps in a row, and a run has fewer
    before its last. Only a value other than the default: the default (2000) equals training.steps'
    own, and the API server writes the CRD's default into every stored spec, so the operator
    cannot tell a value the manifest set (model_fields_set) from the default."""
    interval, steps = spec.precision.loss_scale.growth_interval, spec.training.steps
    if interval < steps or interval == LossScale.model_fields["growth_interval"].default:
        return None
    return (
        f"precision.lossScale.growthInterval={interval} is not below training.steps={steps}: no attempt "
        "has that many clean steps in a row before the last, so the fp16 loss scale never grows, it only "
        "backs off on overflows (a growthInterval below training.steps lets it grow back)"
    )


def _spike_window(spec: MixedPrecisionJobSpec) -> str | None:
    """guard.spike.action rollback that never rolls back; a rule on LossSpike is warned of as a rule."""
    if spec.precision.guard.spike.action != "rollback" or spec.fault_policy.decide(Fault.LOSS_SPIKE).rule is not None:
        return None
    if (unjudged := spikes_never_judged(spec)) is None:
        return None
    return f"{unjudged}: guard.spike.action rollback never rolls back"


def _scale_floor(spec: MixedPrecisionJobSpec) -> str | None:
    """A floor above where the fp16 loss scale stands at the guard's first read ends every fp16
    attempt there, whatever its steps did: the guard reads at log, checkpoint and evaluation steps,
    and the scale has grown at most once per growthInterval clean steps by then."""
    precision, floor = spec.precision, spec.precision.guard.min_loss_scale
    if LOSS_SCALED not in [precision.mode, *precision.fallback]:
        return None
    reads = [spec.training.log_every, spec.checkpoint.every_steps, spec.validation.every_steps]
    first = min(read for read in reads if read > 0)
    scaling = precision.loss_scale
    scale = scaling.init * scaling.growth_factor ** (first // scaling.growth_interval)
    if scale >= floor:
        return None
    return (
        f"precision.guard.minLossScale={floor:g} is above precision.lossScale.init={scaling.init:g}, "
        f"and the scale is at most {scale:g} at the guard's first read (step {first}): every fp16 attempt ends "
        "LossScaleCollapsed there, with no overflow (a floor at or below lossScale.init ends it only once "
        "overflows have backed the scale off below it)"
    )


def _labels_replaced(spec: MixedPrecisionJobSpec) -> str | None:
    """A template label of a key the operator sets on every trainer pod is replaced by its own."""
    if not (keys := replaced_labels(spec.template.labels)):
        return None
    return (
        f"template.labels {', '.join(keys)}: the operator labels every trainer pod with these keys itself "
        f"(app.kubernetes.io/name={APP_NAME_VALUE}, app.kubernetes.io/managed-by={MANAGED_BY_VALUE}, and "
        "mpjob.dev/job, attempt and precision naming its attempt), which replace the template's; name your "
        "labels otherwise"
    )
