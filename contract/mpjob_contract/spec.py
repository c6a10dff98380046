"""The MixedPrecisionJob's spec (user-written): what to train (task, training, validation), with
the blocks of `precision.py` (spec.precision) and `placement.py` (checkpoints, resources, run
policy, pod template)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from mpjob_contract import builtin_args, formats, k8s, rules, spec_size
from mpjob_contract.accounting import CostPerGpuHour
from mpjob_contract.elastic import Elastic
from mpjob_contract.parallelism import Parallelism
from mpjob_contract.placement import Checkpoint, PodTemplateOverrides, Resources, RunPolicy
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.precision import PrecisionSpec
from mpjob_contract.tracking import Tracking
from mpjob_contract.vocabulary import (
    MAX_STEPS,
    MAX_TASK_ARG_DEPTH,
    MAX_TASK_ARGS,
    MAX_WORKERS,
    BuiltinTask,
    CompileMode,
)
from mpjob_contract.wire import ApiModel

#: Why task.args may not name an argument true or false.
BOOLEAN_NAME = (
    "YAML reads an unquoted y, n, on, off, yes or no as a boolean, which kubectl sends as that name; "
    "quote the argument's name"
)


class Task(ApiModel):
    """What to train: a shipped workload, a factory in the image (`pkg.mod:make_task`), or the
    user's own training command (which uses the trainer SDK, see docs/sdk.md)."""

    builtin: BuiltinTask | None = Field(None, description="A workload shipped with the trainer: gpt or mlp.")
    module: str | None = Field(
        None,
        pattern=formats.TASK_MODULE.pattern,
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
        if self.builtin is not None:
            # The operator re-validates every job's spec at each reconcile, so a job stored before this
            # check ends InvalidSpec after an upgrade. Only one that never ran can: the trainer reads the
            # args with these same functions at start and ends such a job a ConfigError.
            try:
                builtin_args.check(self.builtin, self.args)
            except builtin_args.BadTaskArg as bad:
                raise k8s.SchemaViolations([(f"args.{bad.field}".rstrip("."), bad.why)]) from bad
        return self

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        if named := sorted({"true", "false"} & set(value)):
            # What kubectl makes of an unquoted y, n, on, off, yes or no. The API server stores it
            # (task.args is free-form, and CEL cannot type it), so the operator refuses the job.
            raise ValueError(f"names an argument {named[0]}: {BOOLEAN_NAME}")
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


#: training.gradClipNorm's largest: a norm no gradient reaches (0 turns clipping off).
MAX_GRAD_CLIP_NORM = 1_000_000.0


class Training(ApiModel):
    steps: int = Field(2000, ge=1, le=MAX_STEPS, description="Optimizer steps to train.")
    batch_size: int = Field(
        16,
        ge=1,
        le=1_000_000,
        description="Samples per micro-batch per training process (each of workers x processesPerWorker).",
    )
    grad_accumulation: int = Field(1, ge=1, le=4096, description="Micro-batches per optimizer step.")
    learning_rate: float = Field(6.0e-4, gt=0, le=10, description="AdamW peak learning rate.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="AdamW weight decay.")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Linear learning-rate warm-up steps.")
    grad_clip_norm: float = Field(
        1.0, ge=0, le=MAX_GRAD_CLIP_NORM, description="Clip the unscaled global gradient norm to this (0 = off)."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed for init and data order.")
    log_every: int = Field(10, ge=1, le=MAX_STEPS, description="Steps between log lines and metric updates.")
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


#: Evaluations in a row over validation.maxLossDelta that make a QualityDrift (one excursion is recorded only).
DRIFT_IN_A_ROW = 2


class Validation(ApiModel):
    """The quality gate (the reference's M5 and its first production failure: a silent accuracy
    regression in low precision): at intervals the trainer evaluates the current weights in the
    attempt's precision and in fp32 (eval only) on the task's evaluation set."""

    every_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Steps between evaluations (0 = off).")
    max_loss_delta: float = Field(
        0.05,
        gt=0,
        le=100,
        description="Relative eval-loss delta |low - fp32| / |fp32| that, two evaluations in a row, "
        "ends the precision (QualityDrift, a numeric fault: the ladder goes on).",
    )
    batches: int = Field(
        4,
        ge=1,
        le=1000,
        description="Eval batches per evaluation: of training.batchSize, or as a framework adapter's eval "
        "loader gives them (HF: per_device_eval_batch_size, Lightning: its val_dataloader's).",
    )


class MixedPrecisionJobSpec(ApiModel):
    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="Pods of each attempt.")
    image: str | None = Field(
        None, pattern=formats.IMAGE.pattern, description="Trainer image; default from the operator."
    )
    task: Task
    training: Training = Field(
        default_factory=Training, description="Steps, batch size, accumulation, learning rate, clipping, seed, logging."
    )
    precision: PrecisionSpec = Field(
        default_factory=PrecisionSpec,
        description="The precision, the ladder to fall back along, loss scaling, the numeric guard, fp8.",
    )
    checkpoint: Checkpoint = Field(
        default_factory=Checkpoint, description="How often checkpoints are written, how many kept, where they live."
    )
    validation: Validation = Field(default_factory=Validation)
    resources: Resources = Field(
        default_factory=Resources,
        description="GPUs and training processes per worker, the lowest compute capability, CPU and memory.",
    )
    parallelism: Parallelism = Field(default_factory=Parallelism)
    run_policy: RunPolicy = Field(
        default_factory=RunPolicy, description="The attempt budget, deadlines, clean-up, suspension and queueing."
    )
    template: PodTemplateOverrides = Field(default_factory=PodTemplateOverrides)
    cost_per_gpu_hour: CostPerGpuHour | None = Field(None, description="Price of a GPU-hour: status.cost in money too.")
    tracking: Tracking | None = Field(None, description="Experiment tracking the trainer logs the run to (MLflow).")
    fault_policy: FaultPolicy = Field(
        default_factory=FaultPolicy,
        description="What a fault does: rules over the built-in table, the most specific first, then the first "
        "in order (docs/fault-policy.md).",
    )
    elastic: Elastic | None = Field(
        None,
        description="Go on with fewer workers (down to minWorkers) when the cluster cannot hold them all, "
        "and grow back up to `workers` when it can (docs/elastic.md).",
    )

    @model_validator(mode="after")
    def _elastic_fits(self) -> MixedPrecisionJobSpec:
        rules.ELASTIC_MIN_WORKERS_FIT.check(rules.wire_self(self))
        return self

    @model_validator(mode="after")
    def _gate_computes_fp32(self) -> MixedPrecisionJobSpec:
        rules.GATE_NEEDS_FP32_GATHERING.check(rules.wire_self(self))
        return self

    @model_validator(mode="after")
    def _fits_a_launch(self) -> MixedPrecisionJobSpec:
        if (found := spec_size.oversized(self)) is not None:
            raise k8s.SchemaViolations([found])
        return self

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> MixedPrecisionJobSpec:
        rules.MOUNT_NAMES_A_VOLUME.check(self.model_dump(by_alias=True, include={"resources", "template"}))
        return self


def processes_per_worker(spec: MixedPrecisionJobSpec) -> int:
    """Processes the launcher starts per pod: the spec's, else one per GPU, else one."""
    resources = spec.resources
    if resources.processes_per_worker is not None:
        return resources.processes_per_worker
    return max(1, resources.gpus_per_worker)


def world_size(spec: MixedPrecisionJobSpec) -> int:
    """Training processes in one attempt: workers x processesPerWorker."""
    return spec.workers * processes_per_worker(spec)
