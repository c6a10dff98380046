"""Where a run goes besides the cluster: experiment tracking (spec.tracking) and profiles taken
on demand (the `mpjob.dev/profile-steps` annotation, status.profiles).

Both sides read this module: the operator validates and records, the trainer logs and profiles.
The operator never talks to the tracking server and never reads its credentials: the Secret
reaches the trainer pods as environment (`credential_env`), and only the trainer logs.

A profile request travels operator -> trainer over rank 0's metrics port (`PROFILE_PATH`), the
one port the operator already reads with bounded requests; the trainer holds no Kubernetes
token, so it could not read its job's annotation itself. The request carries the attempt's
profile token (`Authorization: Bearer ...`), which only the operator and the attempt's pods
hold: the pods get it as `PROFILE_TOKEN_ENV` from a Secret the operator creates per attempt.
"""

from __future__ import annotations

import posixpath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mpjob_contract import formats
from mpjob_contract.environment import readable
from mpjob_contract.wire import ApiModel

#: Keys of the credentials Secret -> the variables MLflow's client reads (each key optional).
CREDENTIAL_KEYS = {
    "username": "MLFLOW_TRACKING_USERNAME",
    "password": "MLFLOW_TRACKING_PASSWORD",
    "token": "MLFLOW_TRACKING_TOKEN",
}

#: The trainer container's image, as the operator started it (a tracking param).
IMAGE_ENV = "MPJOB_IMAGE"


class MlflowTracking(ApiModel):
    """An MLflow tracking server: the trainer (rank 0) logs one run per job to it."""

    uri: str = Field(
        pattern=formats.MLFLOW_URI.pattern,
        max_length=2048,
        description="Tracking server URI with its scheme, e.g. http://mlflow.mlflow.svc:5000 or https://... .",
    )
    experiment: str = Field("mpjob", min_length=1, max_length=256, description="MLflow experiment (made if missing).")
    credentials_secret: str | None = Field(
        None,
        max_length=253,
        pattern=formats.SECRET_NAME.pattern,
        description="Secret in the job's namespace whose keys username/password or token become "
        "MLFLOW_TRACKING_USERNAME/PASSWORD or MLFLOW_TRACKING_TOKEN in the trainer pods.",
    )


class Tracking(ApiModel):
    mlflow: MlflowTracking | None = None


def credential_env(secret: str) -> list[dict[str, object]]:
    """The trainer container's env entries that carry the credentials Secret's keys (each
    optional: a Secret with only a token, or only a username and password, is fine)."""
    return [
        {"name": env, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        for key, env in CREDENTIAL_KEYS.items()
    ]


# ---------------------------------------------------------------- profiles on demand

#: `kubectl annotate mpj NAME mpjob.dev/profile-steps=20`: profile the next 20 steps once.
PROFILE_ANNOTATION = "mpjob.dev/profile-steps"
MAX_PROFILE_STEPS = 100
#: status.profiles keeps this many entries (the newest).
MAX_PROFILE_ENTRIES = 8
#: A compressed trace larger than this is not kept (the summary still is).
MAX_TRACE_BYTES = 64 * 1024 * 1024
#: The most bytes of the profiler's uncompressed trace read (and parsed): a larger one fails.
MAX_RAW_TRACE_BYTES = 512 * 1024 * 1024
#: Traces an attempt keeps in its job's folder: a newer one prunes the oldest past this.
KEPT_TRACES = 4
#: The trainer's env var holding its attempt's profile token, and the Secret key it is under.
PROFILE_TOKEN_ENV = "MPJOB_PROFILE_TOKEN"
PROFILE_TOKEN_KEY = "profileToken"
#: The trainer's control path on its metrics port, and the most bytes its answer may have.
PROFILE_PATH = "/profile"
MAX_ANSWER_BYTES = 4096
TRACE_FILE = "trace.json.gz"
SUMMARY_FILE = "summary.json"

ProfileState = Literal["Requested", "Capturing", "Captured", "Failed", "Refused"]
FINAL_STATES: tuple[ProfileState, ...] = ("Captured", "Failed", "Refused")
Share = Annotated[float, Field(ge=0, le=1)]


PROFILE_FIELD = f"metadata.annotations[{PROFILE_ANNOTATION}]"


class BadProfileRequest(ValueError):
    """The annotation's value is not a step count the trainer may profile: `field` names the
    annotation, `why` says what is allowed; the message is both."""

    def __init__(self, why: str) -> None:
        super().__init__(f"{PROFILE_FIELD}: {why}")
        self.field, self.why = PROFILE_FIELD, why


def profile_steps(value: str) -> int:
    """The step count an annotation value asks for; BadProfileRequest names the annotation. ASCII
    digits only: `str.isdigit` also takes '²' or '①', which int() refuses with a ValueError that
    would fail every reconcile of the job (and `mpjob validate`) instead of refusing the value."""
    text = value.strip()
    steps = formats.whole_number(text, digits=9)
    if steps is None or not 1 <= steps <= MAX_PROFILE_STEPS:
        raise BadProfileRequest(f"{value[:32]!r} is not allowed: a whole number of steps from 1 to {MAX_PROFILE_STEPS}")
    return steps


def profile_dir(checkpoint_dir: str, profile_id: int) -> str:
    """Where profile `profile_id` of a job lands: below the job's own checkpoint folder."""
    return posixpath.join(checkpoint_dir, "profiles", f"p{profile_id}")


class ProfileStatus(ApiModel):
    """One profile asked for with the annotation: what it asked, where it lands, what it found."""

    id: int = Field(ge=1)
    #: The annotation's value as the user wrote it (a value already recorded is never asked again).
    request: str = Field(max_length=32)
    steps: int | None = None
    attempt: int | None = None
    state: ProfileState
    #: The compressed Chrome/Perfetto trace in the checkpoint store, as trainer pods see it.
    path: str | None = None
    first_step: int | None = None
    trace_bytes: int | None = None
    #: Share of the profiled kernel time spent in fp16/bf16/fp8 kernels (the rest ran in fp32).
    low_precision_kernel_share: float | None = None
    message: str | None = None
    request_time: str | None = None
    finish_time: str | None = None


class ProfileAnswer(BaseModel):
    """The trainer's answer to a profile request (bounded, validated: the pod's word)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    id: int = Field(ge=1)
    state: ProfileState
    steps: int | None = Field(None, ge=0, le=MAX_PROFILE_STEPS)
    first_step: int | None = Field(None, alias="firstStep", ge=0, le=2**53 - 1)
    path: str | None = Field(None, max_length=1024)
    trace_bytes: int | None = Field(None, alias="traceBytes", ge=0, le=2**53 - 1)
    low_precision_kernel_share: Share | None = Field(None, alias="lowPrecisionKernelShare")
    message: str | None = Field(None, max_length=512)

    @field_validator("message")
    @classmethod
    def _readable(cls, value: str | None) -> str | None:
        """Shown in the status and its Events: no terminal control (`environment.readable`)."""
        return readable(value) if value is not None else None

    def to_wire(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)
