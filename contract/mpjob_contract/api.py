"""The MixedPrecisionJob API (group mpjob.dev, version v1alpha1) as pydantic models.

These models are the single source of truth for the schema: `mpjob crd` generates
crds/mixedprecisionjobs.mpjob.dev.yaml from them, `mpjob validate` checks manifests with
them, and the trainer reads its spec through them. Field names are camelCase on the wire
(aliases) and snake_case in Python. Unknown fields are rejected, never dropped.

One file on purpose (it runs past 300 lines): the whole API, spec and status, reads top to
bottom in one place, in the order `kubectl explain` shows it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from mpjob_contract import k8s, rules
from mpjob_contract.accounting import CostPerGpuHour, JobCost
from mpjob_contract.fp8 import Fp8Spec
from mpjob_contract.parallelism import Parallelism
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.skipping import OnBadData, Skipped, SpikeSpec
from mpjob_contract.storage import S3Storage
from mpjob_contract.timeline import PrecisionTimeline
from mpjob_contract.tracking import ProfileStatus, Tracking
from mpjob_contract.wire import ApiModel

GROUP = "mpjob.dev"
VERSION = "v1alpha1"
KIND = "MixedPrecisionJob"
PLURAL = "mixedprecisionjobs"
SINGULAR = "mixedprecisionjob"
SHORT_NAMES = ("mpjob", "mpj")
API_VERSION = f"{GROUP}/{VERSION}"

MAX_ATTEMPTS_LIMIT = 99
#: status.attempts keeps the first attempt and the newest ones, this many in all; the rest are
#: counted in status.attemptCounts (uncharged attempts have no limit but the deadline).
MAX_ATTEMPT_ENTRIES = 21
MAX_WORKERS = 256
MAX_PROCESSES_PER_WORKER = 64
#: task.args entries at most (the CRD's maxProperties): they travel in every trainer pod's env.
MAX_TASK_ARGS = 64
#: How deep a task.args value nests: a scalar, or lists and maps at most this many levels deep
#: ({lr: 0.1}, {betas: [0.9, 0.95]}, {layers: [{dim: 64}]}, {opt: {adam: {betas: [0.9]}}}). The
#: CRD says the same (mpjob.crd), so the API server refuses a deeper document before it is
#: stored: a free-form field takes thousands of levels, more than a client's JSON parser reads.
MAX_TASK_ARG_DEPTH = 3

Precision = Literal["fp8", "fp16", "bf16", "fp32"]
#: A precision, or `auto` until the trainer measured its node: the spec's mode, and an attempt's
#: precision until its measurement relabels it (`settled`). On the wire, the same strings.
RequestedPrecision = Literal["auto", "fp8", "fp16", "bf16", "fp32"]
PrecisionMode = RequestedPrecision
BuiltinTask = Literal["gpt", "mlp"]
#: training.compile: `auto` compiles on CUDA devices only (where it pays for its compile time).
CompileMode = Literal["auto", "always", "never"]
Phase = Literal["Pending", "Running", "Recovering", "Succeeded", "Failed", "Suspended"]

TASK_MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
COMPUTE_CAPABILITY_PATTERN = r"^[0-9]+\.[0-9]+$"
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


class Task(ApiModel):
    """What to train: a shipped workload, a factory in the image (`pkg.mod:make_task`), or the
    user's own training command (which uses the trainer SDK, see docs/sdk.md)."""

    builtin: BuiltinTask | None = Field(None, description="A workload shipped with the trainer: gpt or mlp.")
    module: str | None = Field(
        None,
        pattern=TASK_MODULE_PATTERN,
        description="User task factory `package.module:function`, importable in the image.",
    )
    command: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Your own training command (argv, no shell), run on every process of every worker "
        "by the launcher; it uses the trainer SDK (mpjob_trainer.session).",
    )
    working_dir: str | None = Field(
        None, min_length=1, description="Working directory of `command` (default: the image's)."
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        max_length=MAX_TASK_ARGS,
        description="Keyword arguments handed to the task factory (or the SDK's `args`). Each value is a "
        f"scalar (string, number, boolean) or lists and maps of them nested at most {MAX_TASK_ARG_DEPTH} levels deep.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> Task:
        task = rules.wire_self(self)
        rules.TASK_EXACTLY_ONE_KIND.check(task)
        rules.TASK_WORKING_DIR_NEEDS_COMMAND.check(task)
        return self

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        violations = [found for name, arg in value.items() if (found := _nested_too_deep(str(name), arg))]
        if violations:
            raise k8s.SchemaViolations(violations)
        return value


def _nested_too_deep(path: str, value: Any) -> tuple[str, str] | None:
    """The first list or map in `value` deeper than MAX_TASK_ARG_DEPTH levels (its path, why).
    Walked without recursion and no deeper than the bound, whatever the input's depth."""
    pending: list[tuple[str, Any, int]] = [(path, value, 0)]
    while pending:
        where, item, depth = pending.pop()
        if not isinstance(item, dict | list):
            continue
        if depth == MAX_TASK_ARG_DEPTH:
            return where, (
                f"nested deeper than {MAX_TASK_ARG_DEPTH} levels; a task argument is a scalar, or lists and "
                f"maps of scalars at most {MAX_TASK_ARG_DEPTH} levels deep"
            )
        children = (
            [(f"{where}.{k}", v) for k, v in item.items()]
            if isinstance(item, dict)
            else [(f"{where}[{i}]", v) for i, v in enumerate(item)]
        )
        pending += [(child, v, depth + 1) for child, v in reversed(children)]
    return None


class Training(ApiModel):
    steps: int = Field(2000, ge=1, le=100_000_000, description="Optimizer steps to train.")
    batch_size: int = Field(16, ge=1, le=1_000_000, description="Samples per micro-batch per worker.")
    grad_accumulation: int = Field(1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    learning_rate: float = Field(6.0e-4, gt=0, le=10, description="AdamW peak learning rate.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    grad_clip_norm: float = Field(1.0, ge=0, description="Clip the unscaled global gradient norm to this (0 = off).")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for init and data order.")
    log_every: int = Field(10, ge=1, description="Steps between log lines and metric updates.")
    compile: CompileMode = Field(
        "auto",
        description="torch.compile the model (the builtin loop; run.compile in your own): auto = on CUDA "
        "devices, falling back to eager when compilation fails; always (a failure ends the attempt); never.",
    )
    data_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="DataLoader worker processes per training process (the builtin loop), with pinned memory "
        "and prefetch on CUDA; the sample order stays the step-addressed one. Unset: 2 on CUDA, 0 on CPU.",
    )


class LossScale(ApiModel):
    """GradScaler settings for fp16 (see torch.amp.GradScaler)."""

    init: float = Field(65536.0, gt=0, description="Initial loss scale.")
    growth_factor: float = Field(2.0, gt=1, description="Scale multiplier after growthInterval clean steps.")
    backoff_factor: float = Field(0.5, gt=0, lt=1, description="Scale multiplier on overflow.")
    growth_interval: int = Field(2000, ge=1, description="Clean steps before the scale grows.")


class Guard(ApiModel):
    """When the trainer gives up on a precision (failure modes F1/F2 of the reference)."""

    max_consecutive_overflows: int = Field(
        20, ge=1, description="Consecutive overflow-skipped steps that end the precision."
    )
    min_loss_scale: float = Field(1.0, ge=0, description="A loss scale below this floor ends the precision.")
    max_non_finite_losses: int = Field(3, ge=1, description="Non-finite losses that end the precision.")
    stagnation_steps: int = Field(
        0, ge=0, description="Steps with a stuck loss or zero gradients that end it (0 = off)."
    )
    replay_steps: int = Field(
        4,
        ge=0,
        le=1000,
        description="Before ending a precision, replay up to this many steps ending at the first faulting one "
        "in fp32 from the last good checkpoint: finite -> the precision is at fault (fallback); non-finite "
        "-> the data or the model is (Failed, NonFiniteInFp32). 0 = off.",
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
        default_factory=lambda: list[Precision](["bf16", "fp32"]),
        max_length=4,
        description="Precisions tried in order when a precision gives up (distinct entries, never fp8: "
        "a job starts in fp8 with mode fp8 or auto, and the ladder goes fp8 -> bf16 -> fp32).",
    )
    fp8: Fp8Spec = Field(default_factory=Fp8Spec, description="fp8 attempts (mode fp8, or auto on cc >= 8.9).")
    keep_fp32: list[str] = Field(
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
        description="An fp32 attempt after an fp16/bf16 one halves the micro-batch and doubles gradient "
        "accumulation: the same samples per optimizer step, in the same order, in less activation memory.",
    )
    repromote_after_steps: int = Field(
        0,
        ge=0,
        description="After a fallback, once this many clean steps have passed and a checkpoint is written, "
        "go back up to the faster precision from it (0 = off). A precision that faults again after a "
        "re-promotion is not tried again.",
    )
    max_repromotions: int = Field(2, ge=0, le=16, description="Re-promotions a job may make in all.")
    loss_scale: LossScale = Field(default_factory=LossScale)
    guard: Guard = Field(default_factory=Guard)

    @field_validator("fallback")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        rules.FALLBACK_DISTINCT.check(value)
        rules.FALLBACK_NO_FP8.check(value)
        return value

    @field_validator("keep_fp32")
    @classmethod
    def _identifiers(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"precision.keepFp32 entry {name!r} is not a module type name")
        return value


class PersistentVolumeClaimRef(ApiModel):
    claim_name: str = Field(min_length=1, max_length=253)
    read_only: bool = Field(False, description="Must be false: the job writes its checkpoints to the claim.")

    @model_validator(mode="after")
    def _writable(self) -> PersistentVolumeClaimRef:
        rules.WRITABLE_CHECKPOINT_CLAIM.check(rules.wire_self(self))
        return self


class CheckpointVolume(ApiModel):
    """Where checkpoints live; never deleted by mpjob."""

    persistent_volume_claim: PersistentVolumeClaimRef | None = None
    empty_dir: dict[str, Any] | None = None  # Kubernetes' EmptyDirVolumeSource (medium, sizeLimit)

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_empty_dir(cls, data: Any) -> Any:
        """emptyDir checked against Kubernetes' own schema of it, as the API server does."""
        if isinstance(data, dict):
            value = data.get("emptyDir", data.get("empty_dir"))
            schema = k8s.spec_schemas()["checkpoint.volume.emptyDir"]
            violations = k8s.check(value, schema, "emptyDir") if value is not None else []
            if violations:
                raise k8s.SchemaViolations(violations)
        return data

    @model_validator(mode="after")
    def _one_source(self) -> CheckpointVolume:
        rules.ONE_CHECKPOINT_SOURCE.check(rules.wire_self(self))
        return self


class CheckpointStorage(ApiModel):
    """Where checkpoints live: a volume, or an S3-compatible bucket (mpjob_contract.storage)."""

    volume: CheckpointVolume | None = None
    s3: S3Storage | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> CheckpointStorage:
        rules.ONE_STORAGE_KIND.check(rules.wire_self(self))
        return self


class Validation(ApiModel):
    """The quality gate (the reference's M5 and its first production failure: a silent accuracy
    regression in low precision): at intervals the trainer evaluates the current weights in the
    attempt's precision and in fp32 (eval only) on the task's evaluation set."""

    every_steps: int = Field(0, ge=0, description="Steps between evaluations (0 = off).")
    max_loss_delta: float = Field(
        0.05,
        gt=0,
        le=100,
        description="Relative eval-loss delta |low - fp32| / |fp32| that, two evaluations in a row, "
        "ends the precision (QualityDrift, a numeric fault: the ladder goes on).",
    )
    batches: int = Field(4, ge=1, le=1000, description="Eval batches of training.batchSize per evaluation.")


class Checkpoint(ApiModel):
    every_steps: int = Field(200, ge=1, description="Steps between checkpoints.")
    keep: int = Field(3, ge=1, le=100, description="Checkpoints kept; older ones are pruned.")
    volume: CheckpointVolume | None = Field(
        None, description="Checkpoint volume (a PVC for resumes across pods). Default: emptyDir."
    )
    storage: CheckpointStorage | None = Field(None, description="A volume or an S3 bucket (instead of volume).")

    @model_validator(mode="after")
    def _one_place(self) -> Checkpoint:
        rules.VOLUME_OR_STORAGE.check(rules.wire_self(self))
        return self

    @property
    def s3(self) -> S3Storage | None:
        """The bucket checkpoints go to, if any."""
        return self.storage.s3 if self.storage is not None else None

    @property
    def volume_source(self) -> CheckpointVolume | None:
        """The volume checkpoints go to (None: emptyDir, or a bucket)."""
        return self.volume if self.volume is not None else self.storage.volume if self.storage else None


Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]


class Resources(ApiModel):
    gpus_per_worker: int = Field(1, ge=0, le=16, description="nvidia.com/gpu per pod; 0 = CPU job.")
    processes_per_worker: int | None = Field(
        None,
        ge=1,
        le=MAX_PROCESSES_PER_WORKER,
        description="Training processes the launcher starts in each pod (default: gpusPerWorker, 1 for CPU jobs).",
    )
    min_compute_capability: str = Field(
        "7.0", pattern=COMPUTE_CAPABILITY_PATTERN, description="Lowest GPU compute capability."
    )
    requests: dict[str, int | Quantity] = Field(default_factory=dict)
    limits: dict[str, int | Quantity] = Field(default_factory=dict)


class RunPolicy(ApiModel):
    max_attempts: int = Field(6, ge=1, le=MAX_ATTEMPTS_LIMIT, description="Attempts in all.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Whole-job deadline.")
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the children this long after the job finished."
    )
    suspend: bool = Field(False, description="Stop the running attempt after a checkpoint.")
    queue_name: str = Field("", max_length=63, description="Kueue LocalQueue; each attempt Job is labelled with it.")
    pod_creation_timeout_seconds: int = Field(
        300,
        ge=1,
        description="Fail the job when the Job controller could not create an attempt's pods (Pod Security, "
        "quota, an admission webhook) this long after the attempt started.",
    )


class PodTemplateOverrides(ApiModel):
    """Pod fields merged into every trainer pod; the trainer container is never replaced."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    env: list[dict[str, Any]] = Field(default_factory=list)
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    priority_class_name: str | None = None
    service_account_name: str | None = None
    image_pull_secrets: list[dict[str, Any]] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_schemas(cls, data: Any) -> Any:
        """Each field checked against Kubernetes' own schema of it, as the API server does."""
        if isinstance(data, dict):
            aliases: dict[str, str] = {name: field.alias or name for name, field in cls.model_fields.items()}
            wire = {aliases.get(str(key), str(key)): value for key, value in data.items()}
            violations = k8s.check_template(wire)
            if violations:
                raise k8s.SchemaViolations(violations)
        return data

    @model_validator(mode="after")
    def _no_kubernetes_credentials(self) -> PodTemplateOverrides:
        """Trainers hold no Kubernetes credentials: no projected ServiceAccount token (the pod
        mounts none of its own: automountServiceAccountToken is the operator's, always false)."""
        violations = [
            found
            for i, volume in enumerate(self.volumes)
            for j, source in enumerate((volume.get("projected") or {}).get("sources") or [])
            if (found := rules.NO_SERVICE_ACCOUNT_TOKEN.violation(source, at=f"volumes[{i}].projected.sources[{j}]"))
        ]
        if violations:
            raise k8s.SchemaViolations(violations)
        return self


class MixedPrecisionJobSpec(ApiModel):
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="Pods of each attempt.")
    image: str | None = Field(None, description="Trainer image; default from the operator.")
    task: Task
    training: Training = Field(default_factory=Training)
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    validation: Validation = Field(default_factory=Validation)
    resources: Resources = Field(default_factory=Resources)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    cost_per_gpu_hour: CostPerGpuHour | None = Field(None, description="Price of a GPU-hour: status.cost in money too.")
    tracking: Tracking | None = Field(None, description="Experiment tracking the trainer logs the run to (MLflow).")
    fault_policy: FaultPolicy = Field(
        default_factory=FaultPolicy,
        description="What a fault does: rules over the built-in table, first match wins (docs/fault-policy.md).",
    )

    @model_validator(mode="after")
    def _sharded_on_a_volume(self) -> MixedPrecisionJobSpec:
        rules.SHARDED_ON_A_VOLUME.check(rules.wire_self(self))
        return self


# ---------------------------------------------------------------- status (operator-written)


class CheckpointStatus(ApiModel):
    step: int
    sha256: str = ""
    precision: str = ""
    path: str = ""


class AttemptStatus(ApiModel):
    index: int
    precision: RequestedPrecision
    start_step: int = 0
    end_step: int | None = None
    #: Training processes of the attempt: workers x processesPerWorker.
    world_size: int | None = None
    #: Samples per micro-batch per process and micro-batches per optimizer step in this attempt
    #: (fallback to fp32 and running out of GPU memory split the micro-batch; their product
    #: stays training.batchSize x training.gradAccumulation).
    micro_batch: int | None = None
    grad_accumulation: int | None = None
    #: This attempt went back up to a faster precision after a fallback (Repromote).
    repromoted: bool | None = None
    #: `auto` attempts: seconds per step the trainer measured on its node, by precision (None:
    #: non-finite); `precision` is the one it chose ("auto" until it has measured).
    measured_step_seconds: dict[str, float | None] | None = None
    reason: str | None = None
    exit_code: int | None = None
    message: str | None = None
    #: Whether the attempt used one of runPolicy.maxAttempts: false only when the cluster showed
    #: a disruption (the pod's DisruptionTarget, its queue suspending the Job, the node gone) or
    #: the user suspended the job; a trainer's own word (exit 44, a Preempted report) is charged.
    charged: bool | None = None
    start_time: str | None = None
    finish_time: str | None = None
    #: Its last loss and loss scale (fp16 only), as status.loss and status.lossScale held them
    #: when it ended: a finished job whose last attempt logged none shows these.
    loss: float | None = None
    loss_scale: float | None = None
    #: What it cost (mpjob_contract.accounting): GPU-seconds seen, samples trained, and the steps
    #: (and their share of GPU-seconds) a later attempt trained again.
    gpu_seconds: float | None = None
    samples: int | None = None
    wasted_steps: int | None = None
    wasted_gpu_seconds: float | None = None


class AttemptCounts(ApiModel):
    """Every attempt of the job, counted: attempts[] keeps only the first and the newest
    (MAX_ATTEMPT_ENTRIES in all), so these counts, not the entries, decide the attempt budget."""

    #: Attempts begun (the next one's index, as attempts are numbered from 0).
    started: int = 0
    #: Ended attempts that used runPolicy.maxAttempts.
    charged: int = 0
    #: Attempts that went back up to a faster precision (precision.maxRepromotions).
    repromotions: int = 0
    #: Ended attempts by reason (NumericFault, Preempted, ...).
    by_reason: dict[str, int] = Field(default_factory=dict)
    #: Entries dropped from attempts[] (between the first and the newest).
    omitted: int = 0


class Condition(ApiModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str
    observed_generation: int | None = None


class MixedPrecisionJobStatus(ApiModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")

    phase: Phase = "Pending"
    precision: RequestedPrecision | None = None
    attempt: int = 0
    step: int = 0
    total_steps: int | None = None
    loss: float | None = None
    loss_scale: float | None = None
    overflow_steps: int | None = None
    samples_per_second: float | None = None
    #: The quality gate's last evaluation: eval loss in the attempt's precision, and its relative
    #: delta to fp32 at the same weights.
    eval_loss: float | None = None
    eval_loss_delta: float | None = None
    #: Steps and samples skipped as bad data or loss spikes (guard.onBadData, guard.spike).
    skipped: Skipped | None = None
    last_checkpoint: CheckpointStatus | None = None
    attempts: list[AttemptStatus] = Field(default_factory=list)
    attempt_counts: AttemptCounts | None = None
    cost: JobCost | None = None
    timeline: PrecisionTimeline | None = None
    conditions: list[Condition] = Field(default_factory=list)
    #: Profiles asked for with the mpjob.dev/profile-steps annotation, newest last (bounded).
    profiles: list[ProfileStatus] = Field(default_factory=list)
    observed_generation: int | None = None
    message: str | None = None
    start_time: str | None = None
    completion_time: str | None = None


class ObjectMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    namespace: str | None = None

    @field_validator("name")
    @classmethod
    def _fits_child_names(cls, value: str) -> str:
        rules.NAME_FITS_CHILD_NAMES.check({"metadata": {"name": value}})
        return value


class MixedPrecisionJob(BaseModel):
    """A whole manifest, as `kubectl apply` would send it."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    api_version: Literal["mpjob.dev/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["MixedPrecisionJob"]
    metadata: ObjectMeta
    spec: MixedPrecisionJobSpec
    status: MixedPrecisionJobStatus | None = None


def processes_per_worker(spec: MixedPrecisionJobSpec) -> int:
    """Processes the launcher starts per pod: the spec's, else one per GPU, else one."""
    resources = spec.resources
    if resources.processes_per_worker is not None:
        return resources.processes_per_worker
    return max(1, resources.gpus_per_worker)


def world_size(spec: MixedPrecisionJobSpec) -> int:
    """Training processes in one attempt: workers x processesPerWorker."""
    return spec.workers * processes_per_worker(spec)


def precision_ladder(spec: PrecisionSpec, resolved_first: Precision) -> list[Precision]:
    """The precisions attempts walk through: the first, then the fallback list (which holds no
    fp8: rules.FALLBACK_NO_FP8), no repeats."""
    ladder: list[Precision] = [resolved_first]
    for p in spec.fallback:
        if p not in ladder:
            ladder.append(p)
    return ladder


def is_auto(precision: str | None) -> bool:
    """Whether `precision` is still `auto`: its trainer has not measured the node yet."""
    return precision == "auto"


def settled(precision: RequestedPrecision, measured: Precision | None) -> RequestedPrecision:
    """An `auto` precision, once measured, is the measured one; any other stays as it is."""
    return measured if is_auto(precision) and measured else precision


def resolve_auto(mode: PrecisionMode, compute_capability: tuple[int, int] | None) -> Precision:
    """Resolve `auto` for a device: None means CPU. Explicit modes pass through."""
    if mode != "auto":
        return mode
    if compute_capability is None:
        return "bf16"
    if compute_capability >= (8, 0):
        return "bf16"
    if compute_capability >= (7, 0):
        return "fp16"
    return "fp32"
