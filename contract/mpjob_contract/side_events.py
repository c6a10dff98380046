"""The event lines of what rank 0 runs beside training (mpjob_contract.tracking): profiles
taken on demand and experiment tracking. Models as `event_models`' (camelCase on the wire)."""

from __future__ import annotations

from pydantic import Field

from mpjob_contract.event_models import TrainerEvent


class Profile(TrainerEvent):
    """A profile taken on demand (the mpjob.dev/profile-steps annotation), written out."""

    name = "profile"
    id: int
    step: int
    steps: int
    path: str
    trace_bytes: int = Field(alias="traceBytes")
    low_precision_kernel_share: float | None = Field(None, alias="lowPrecisionKernelShare")


class TrackingFailed(TrainerEvent):
    """The attempt's first failure to log to its tracking server (spec.tracking): training goes
    on, what failed to go is not sent again. Written once per trainer process: the later ones,
    counted in `mpjob_trainer_tracking_failures_total`, go to rank 0's stderr (the first, then
    every 100th). `mpjob run` shows it on its console; `error` is the exception, its first line."""

    name = "trackingFailed"
    error: str
