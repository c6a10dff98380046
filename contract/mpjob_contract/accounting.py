"""What a job's attempts cost: the spec's price of a GPU-hour and the status's sums.

GPU-seconds are pods x nvidia.com/gpu per pod x the seconds each pod's trainer container ran,
from the container's own start and finish times as the operator saw them in the pod's status
(a pod it never saw ended, or never saw at all, adds nothing: the figures are a lower bound,
never a claim of time not seen).

Wasted GPU-seconds are the GPU time that bought nothing the job kept:
- `rollback`: an attempt whose last steps a later attempt trained again (it resumed from an
  earlier checkpoint) wasted `gpuSeconds x wastedSteps / trainedSteps` of its GPU time, where
  trainedSteps = endStep - startStep and wastedSteps = endStep - the next attempt's startStep;
  its set-up (start, resume, measurement) is shared out over its steps in that proportion;
- `setup`: an attempt that ended without success having trained no step past where it began
  wasted all of its GPU time (start-up and resume that led nowhere).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from mpjob_contract import formats

#: The highest price of a GPU-hour the API takes (a typo guard, not a market view).
MAX_PRICE_PER_GPU_HOUR = 1_000_000.0


class WasteReason(StrEnum):
    """Why GPU time was wasted (the `reason` label of mpjob_operator_wasted_gpu_seconds_total)."""

    ROLLBACK = "rollback"
    SETUP = "setup"


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CostPerGpuHour(_Model):
    """The price of one GPU for one hour, to show GPU-seconds as money in status and metrics."""

    amount: float = Field(
        ge=0, le=MAX_PRICE_PER_GPU_HOUR, allow_inf_nan=False, description="Price of one GPU-hour (>= 0)."
    )
    currency: str = Field(
        pattern=formats.CURRENCY.pattern, description="ISO 4217 currency code: three capital letters (EUR, USD)."
    )


class JobCost(_Model):
    """What the job's attempts cost so far, summed over every attempt (also those no longer in
    attempts[]): see each attempt's gpuSeconds, wastedSteps and wastedGpuSeconds."""

    gpu_seconds: float = Field(
        0.0,
        description="GPU-seconds of all attempts: pods x gpusPerWorker x the seconds each pod's trainer "
        "container ran (start to finish as the operator saw them; time not seen is not counted).",
    )
    wasted_gpu_seconds: float = Field(
        0.0,
        description="GPU-seconds that bought nothing kept: for an attempt a later one rolled back, "
        "gpuSeconds x wastedSteps / (endStep - startStep); for an attempt that ended without success "
        "having trained no step, all its gpuSeconds (set-up).",
    )
    wasted_steps: int = Field(
        0, description="Steps trained and then trained again: an attempt's endStep minus the next one's startStep."
    )
    currency: str | None = Field(None, description="spec.costPerGpuHour.currency, when a price is set.")
    amount: float | None = Field(None, description="gpuSeconds at spec.costPerGpuHour (its current price).")
    wasted_amount: float | None = Field(None, description="wastedGpuSeconds at spec.costPerGpuHour.")
