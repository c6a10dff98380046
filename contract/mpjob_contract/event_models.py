"""The trainer's event lines as models, one per event (the schema of `mpjob_contract.events`);
those of what runs beside training (tracking, profiles) are in `mpjob_contract.side_events`, those
of the checkpoint store's own housekeeping in `mpjob_contract.store_events`.

camelCase on the wire, stable: a field an event does not have is refused by the writer and
ignored by the reader (`events.format_line`, `events.parse_line`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from mpjob_contract.report import Measurement, Replay
from mpjob_contract.skipping import SampleRange, Skipped


class TrainerEvent(BaseModel):
    """Fields every line has; `name` is the event's "event" value."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    name: ClassVar[str]
    time: float | None = None
    rank: int | None = None


class Start(TrainerEvent):
    name = "start"
    attempt: int
    precision: str
    requested_precision: str = Field(alias="requestedPrecision")
    device: str
    #: The devices every process of the attempt trains on, distinct (rank 0's `device` among
    #: them); empty from a trainer that did not say: its `device` alone is known.
    devices: list[str] = Field(default_factory=list)
    world_size: int = Field(alias="worldSize")
    start_step: int = Field(alias="startStep")
    total_steps: int = Field(alias="totalSteps")
    metrics_port: int | None = Field(None, alias="metricsPort")

    @property
    def every_device(self) -> list[str]:
        """The devices the attempt's processes train on, as far as the line tells them."""
        return self.devices or [self.device]


class CheckpointRejected(TrainerEvent):
    name = "checkpointRejected"
    path: str
    problem: str


class CheckpointOutsideLineage(TrainerEvent):
    """A checkpoint written by a Job outside the attempt's lineage (a stray one, made after its
    attempt had ended; the trainer's checkpoint.lineage): one a resume or a rollback passed over,
    left as it is, or one a save of the same step set aside (never deleted)."""

    name = "checkpointOutsideLineage"
    path: str
    problem: str


class KeepFp32(TrainerEvent):
    """Module names wrapped to run in fp32, and the listed types autocast already runs in fp32."""

    name = "keepFp32"
    wrapped: list[str]
    skipped: list[str]


class Fp8(TrainerEvent):
    """An fp8-capable attempt's conversion: the linears now torchao float8 ones, and why the
    others stayed in bf16 (first linear, last linear, dimensions, skip)."""

    name = "fp8"
    converted: list[str]
    kept: dict[str, str]
    recipe: str
    emulate: bool


class Compile(TrainerEvent):
    name = "compile"
    mode: str
    compiled: bool


class Wrap(TrainerEvent):
    """How run.wrap shared the model (spec.parallelism)."""

    name = "wrap"
    strategy: str
    checkpointed_blocks: list[int] = Field(default_factory=list, alias="checkpointedBlocks")
    #: fsdp: the modules sharded on their own (keepFp32 ones, blocks), root ("") last.
    sharded: list[str] | None = None


class PrecisionMeasured(TrainerEvent, Measurement):
    name = "precisionMeasured"


class Resume(TrainerEvent):
    name = "resume"
    step: int
    path: str
    sha256: str
    from_precision: str = Field(alias="fromPrecision")


class FreshStart(TrainerEvent):
    name = "freshStart"
    reason: str


class Step(TrainerEvent):
    """The figures of one log interval (rank 0's line; `loss` is the job's, the mean over every rank's samples)."""

    name = "step"
    step: int
    loss: float | None = None
    loss_scale: float | None = Field(None, alias="lossScale")  # fp16 only
    grad_norm: float | None = Field(None, alias="gradNorm")
    lr: float | None = None
    overflow_steps: int = Field(0, alias="overflowSteps")
    non_finite_losses: int = Field(0, alias="nonFiniteLosses")
    applied_steps: int | None = Field(None, alias="appliedSteps")
    samples_per_second: float | None = Field(None, alias="samplesPerSecond")
    tokens_per_second: float | None = Field(None, alias="tokensPerSecond")
    mfu: float | None = None
    step_seconds: float | None = Field(None, alias="stepSeconds")
    precision: str | None = None
    peak_device_memory_bytes: int | None = Field(None, alias="peakDeviceMemoryBytes")


class CheckpointStaged(TrainerEvent):
    """The training thread's wait for a periodic save."""

    name = "checkpointStaged"
    step: int
    stall_seconds: float = Field(alias="stallSeconds")


class Checkpoint(TrainerEvent):
    name = "checkpoint"
    step: int
    path: str
    sha256: str
    seconds: float
    bytes: int
    asynchronous: bool = Field(alias="async")


class CheckpointSkipped(TrainerEvent):
    name = "checkpointSkipped"
    step: int
    why: str


class CheckpointFailed(TrainerEvent):
    name = "checkpointFailed"
    step: int
    training_step: int = Field(alias="trainingStep")
    error: str
    failures: int


class Eval(TrainerEvent):
    """The quality gate: eval loss in the attempt's precision and in fp32."""

    name = "eval"
    step: int
    loss: float | None = None
    loss_fp32: float | None = Field(None, alias="lossFp32")
    delta: float | None = None
    seconds: float


class Fault(TrainerEvent):
    name = "fault"
    step: int
    rule: str
    message: str


class ReplayDone(TrainerEvent, Replay):
    name = "replay"


class ReplaySkipped(TrainerEvent):
    name = "replaySkipped"
    why: str


class DataSkipped(TrainerEvent):
    """Steps rolled back and skipped (guard.onBadData, guard.spike): the attempt goes on from
    the checkpoint at `fromStep` without those steps' samples."""

    name = "dataSkipped"
    cause: str
    steps: list[int]
    samples: list[SampleRange] = Field(default_factory=list)
    from_step: int = Field(alias="fromStep")
    #: Steps skipped so far in the run (guard.maxSkippedSteps bounds it).
    skipped_steps: int = Field(alias="skippedSteps")
    #: The run's quarantine after this skip, bounded as status.skipped (`mpjob run`'s live record).
    quarantine: Skipped | None = None


class LossSpike(TrainerEvent):
    """A finite loss above its window's mean by more than guard.spike.zScore deviations."""

    name = "lossSpike"
    first_step: int = Field(alias="firstStep")
    last_step: int = Field(alias="lastStep")
    detected_at: int = Field(alias="detectedAt")


class PrecisionChanged(TrainerEvent):
    """A change made in the running processes (report.InPlaceChange): the attempt `attempt - 1`
    ended at `step` (a `fallback` on its fault's rule and message, its `repromote`, or out of
    device memory: `microBatch`, the same precision in a smaller split), and attempt `attempt`
    trains in `toPrecision` from `startStep`."""

    name = "precisionChanged"
    kind: str = "fallback"
    attempt: int
    step: int
    start_step: int = Field(alias="startStep")
    from_precision: str = Field(alias="fromPrecision")
    to_precision: str = Field(alias="toPrecision")
    rule: str
    message: str
    recovery_seconds: float = Field(alias="recoverySeconds")
    at: float | None = None
    #: A `microBatch` change's new split (report.InPlaceChange).
    micro_batch: int | None = Field(None, alias="microBatch")
    grad_accumulation: int | None = Field(None, alias="gradAccumulation")


class Repromote(TrainerEvent):
    name = "repromote"
    step: int
    clean_steps: int = Field(alias="cleanSteps")


class Preempted(TrainerEvent):
    name = "preempted"
    step: int


class Done(TrainerEvent):
    name = "done"
    step: int
    loss: float | None = None
    applied_steps: int | None = Field(None, alias="appliedSteps")


class Error(TrainerEvent):
    name = "error"
    kind: str
    message: str
