"""spec.precision: the first attempt's precision, the fallback ladder, fp16's loss scale and the
numeric guard that decides when a precision gives up."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from mpjob_contract import formats, rules
from mpjob_contract.fp8 import Fp8Spec
from mpjob_contract.skipping import OnBadData, SpikeSpec
from mpjob_contract.vocabulary import (
    MAX_LOSS_SCALE,
    MAX_STEPS,
    Precision,
    PrecisionMode,
    RequestedPrecision,
    safer_than,
)
from mpjob_contract.wire import ApiModel


class LossScale(ApiModel):
    """GradScaler settings for fp16 (see torch.amp.GradScaler)."""

    init: float = Field(65536.0, gt=0, le=MAX_LOSS_SCALE, description="Initial loss scale.")
    growth_factor: float = Field(2.0, gt=1, le=1000, description="Scale multiplier after growthInterval clean steps.")
    backoff_factor: float = Field(0.5, gt=0, lt=1, description="Scale multiplier on overflow.")
    growth_interval: int = Field(2000, ge=1, le=MAX_STEPS, description="Clean steps before the scale grows.")


class Guard(ApiModel):
    """When the trainer gives up on a precision (failure modes F1/F2 of the reference)."""

    max_consecutive_overflows: int = Field(
        20, ge=1, le=MAX_STEPS, description="Consecutive overflow-skipped steps that end the precision."
    )
    min_loss_scale: float = Field(
        1.0, ge=0, le=MAX_LOSS_SCALE, description="A loss scale below this floor ends the precision."
    )
    max_non_finite_losses: int = Field(3, ge=1, le=MAX_STEPS, description="Non-finite losses that end the precision.")
    stagnation_steps: int = Field(
        0, ge=0, le=MAX_STEPS, description="Steps with a stuck loss or zero gradients that end it (0 = off)."
    )
    replay_steps: int = Field(
        4,
        ge=0,
        le=1000,
        description="Before ending a precision, replay up to this many steps ending at the first faulting one "
        "in fp32 from the last good checkpoint: finite -> the precision is at fault (fallback); non-finite "
        "-> the data or the model is (guard.onBadData: skip the step, or fail NonFiniteInFp32). 0 = off.",
    )
    replay_timeout_seconds: int = Field(
        300, ge=1, le=86400, description="Time cap of that replay; past it the precision is blamed."
    )
    on_bad_data: OnBadData = Field(
        "skip",
        description="When the fp32 replay finds a step non-finite in fp32 too: skip: roll back to the last good "
        "checkpoint, quarantine that step's samples (kept in checkpoints, never served again) and go on in the "
        "same precision; fail: the attempt ends NonFiniteInFp32.",
    )
    max_skipped_steps: int = Field(
        4, ge=0, le=1000, description="Steps skipped (bad data and loss spikes) before the attempt fails as bad data."
    )
    spike: SpikeSpec = Field(default_factory=SpikeSpec, description="Finite loss spikes (see spike.action).")


class PrecisionSpec(ApiModel):
    mode: PrecisionMode = Field(
        "auto",
        description="Precision of the first attempt. auto: measured on the node: the fastest of fp32, "
        "bf16 (compute capability >= 8.0, CPU) and fp16 (>= 7.0) that stays finite, when it beats fp32 "
        "by 5 %; else fp32 (condition AmpSlowerThanFp32); fp8 (>= 8.9) only when it beats bf16 by 5 % too. "
        "Fallbacks follow the measured precision. fp8: torchao float8 linears, the rest under bf16 "
        "autocast (precision.fp8).",
    )
    fallback: list[Precision] = Field(
        default_factory=lambda data: default_fallback(data.get("mode", "auto")),
        max_length=4,
        description="Precisions tried in order when a precision gives up, each safer than mode and than the "
        "one before it (fp8 < fp16 < bf16 < fp32; never fp8: a job starts in fp8 with mode fp8 or auto, and "
        "the ladder goes fp8 -> bf16 -> fp32). Unset: those of [bf16, fp32] safer than mode (fp32: none).",
    )
    fp8: Fp8Spec = Field(default_factory=Fp8Spec, description="fp8 attempts (mode fp8, or auto on cc >= 8.9).")
    keep_fp32: list[Annotated[str, Field(pattern=formats.MODULE_TYPE.pattern)]] = Field(
        default_factory=lambda: ["LayerNorm"],
        description="Module type names (classes) run in fp32 under autocast (F4). Types autocast already runs "
        "in fp32 cost nothing and are left alone: on CUDA LayerNorm, GroupNorm, RMSNorm (torch >= 2.12), Softmax, "
        "LogSoftmax, Softplus, CosineSimilarity and most losses (MSELoss, L1Loss, NLLLoss, KLDivLoss, "
        "BCEWithLogitsLoss, ...; not CrossEntropyLoss); on a CPU only those losses and CrossEntropyLoss. "
        "Any other type gets a wrapper that turns autocast off and casts its floating inputs to fp32.",
    )
    tf32: bool = Field(False, description="Allow TF32 matmuls in fp32 attempts.")
    fallback_keeps_batch: bool = Field(
        True,
        description="An fp32 attempt after an fp16/bf16 one splits the micro-batch (divided by its smallest prime "
        "factor, gradient accumulation multiplied by it): the same samples per optimizer step, in the same order, "
        "in less activation memory.",
    )
    repromote_after_steps: int = Field(
        0,
        ge=0,
        le=MAX_STEPS,
        description="After a fallback, once this many clean steps have passed and a checkpoint is written, "
        "go back up to the faster precision from it (0 = off), while runPolicy.maxAttempts leaves an attempt "
        "for it. A precision that faults again after a re-promotion is not tried again.",
    )
    max_repromotions: int = Field(2, ge=0, le=16, description="Re-promotions a job may make in all.")
    in_place: bool = Field(
        True,
        alias="inPlace",
        description="Fall back in the running processes: restore the last good checkpoint, switch autocast and "
        "GradScaler, run the steps since it again, go on (a new attempt, inPlace: true, no pod restarted). "
        "false: every fallback restarts the pods. An auto attempt changes in place from the precision it "
        "measured. What cannot change in place restarts either way: a framework adapter, a change of micro-batch "
        "split by a loop with no reshape or with fsdp, an elastic job.",
    )
    loss_scale: LossScale = Field(default_factory=LossScale)
    guard: Guard = Field(default_factory=Guard)

    @field_validator("fallback")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        rules.FALLBACK_DISTINCT.check(value)
        rules.FALLBACK_NO_FP8.check(value)
        return value

    @model_validator(mode="after")
    def _safer_in_order(self) -> PrecisionSpec:
        rules.FALLBACK_SAFER_IN_ORDER.check(rules.wire_self(self))
        return self


#: The fallback ladder a job gets when it names none: the rungs of this one safer than its mode.
DEFAULT_FALLBACK: tuple[Precision, ...] = ("bf16", "fp32")


def default_fallback(mode: Any) -> list[Precision]:
    """spec.precision.fallback when unset: DEFAULT_FALLBACK's rungs safer than `mode` (auto: all)."""
    return [p for p in DEFAULT_FALLBACK if safer_than(p, mode if isinstance(mode, str) else "auto")]


def fallbacks_after(spec: PrecisionSpec, first: RequestedPrecision) -> list[Precision]:
    """The fallback list's rungs safer than `first`, in order: all of them for an `auto` first (a
    measured precision off the list keeps only those above it; an explicit mode has no others)."""
    return [p for p in dict.fromkeys(spec.fallback) if safer_than(p, first)]


def precision_ladder(spec: PrecisionSpec, resolved_first: Precision) -> list[Precision]:
    """The precisions attempts walk through: the first, then the fallback list's rungs safer than
    it (rules.FALLBACK_SAFER_IN_ORDER: for an explicit mode, the whole list)."""
    return [resolved_first, *fallbacks_after(spec, resolved_first)]
