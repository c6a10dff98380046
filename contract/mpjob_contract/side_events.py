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
    """A failure to log to the tracking server (spec.tracking): training goes on, what failed to
    go is not sent again. Written for the trainer process's first failure, and for each that
    leaves the runs short of what happened (a change in place not all recorded, the runs' end
    not recorded or not sent within MPJOB_TRACKING_CLOSE_SECONDS); the others, counted in
    `mpjob_trainer_tracking_failures_total`, go to rank 0's stderr (the first, then every 100th).
    `mpjob run` shows it on its console; `error` is the exception, its first line. Also told: the
    job's run keeping a param this attempt has otherwise (`ParamsKept: ...`; MLflow keeps a
    param's first value)."""

    name = "trackingFailed"
    error: str
