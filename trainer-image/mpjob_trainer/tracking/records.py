"""What an attempt tells the tracking server, as plain data: the job's params, the attempt's
tags, and the metrics of each event line. Pure: no MLflow here (tracking.mlflow_run sends it).

The event lines are the trainer's one account of a run (mpjob_contract.events): the same
"step", "eval" and "fault" lines `mpjob run` draws its view from become MLflow metrics and tags,
so the tracking server and the local view cannot disagree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from mpjob_contract.codes import ExitCode, reason_for_exit_code
from mpjob_contract.launch import AttemptLaunch

#: Tag names (MLflow's own parent tag nests an attempt's run under the job's).
TAG_JOB_KEY = "mpjob.jobKey"
TAG_LEVEL = "mpjob.level"
TAG_ATTEMPT = "mpjob.attempt"
TAG_PRECISION = "mpjob.precision"
TAG_ENDING = "mpjob.ending"
TAG_FALLBACK_REASON = "mpjob.fallbackReason"
TAG_SKIPPED = "mpjob.skipped"
TAG_PARENT = "mlflow.parentRunId"
#: Metric name <- the "step" line's field.
STEP_METRICS = {
    "loss": "loss",
    "loss_scale": "lossScale",
    "grad_norm": "gradNorm",
    "lr": "lr",
    "samples_per_second": "samplesPerSecond",
    "tokens_per_second": "tokensPerSecond",
    "mfu": "mfu",
    "step_seconds": "stepSeconds",
    "overflow_steps": "overflowSteps",
    "non_finite_losses": "nonFiniteLosses",
}
EVAL_METRICS = {"eval_loss": "loss", "eval_loss_fp32": "lossFp32", "eval_loss_delta": "delta"}
#: MLflow's limit on a param value (longer ones are cut).
MAX_PARAM_CHARS = 6000


@dataclass(frozen=True)
class Point:
    key: str
    value: float
    step: int
    timestamp_ms: int


@dataclass
class Update:
    """One event's worth of records for the attempt's run (and metrics for the job's run too)."""

    metrics: list[Point] = field(default_factory=list)
    attempt_tags: dict[str, str] = field(default_factory=dict)
    job_tags: dict[str, str] = field(default_factory=dict)
    #: The attempt the processes trained when the event was written (its run takes the records).
    attempt: int = 0


@dataclass(frozen=True)
class Change:
    """Attempt `attempt - 1` ended and attempt `attempt` began in the same processes (a change
    made in place: a `precisionChanged` line). The ending attempt's run ends as the restart's
    exit would have ended it (`status`, `ending_tags`), the job's run takes `job_tags`, and the
    next attempt's run opens with the tags a restarted attempt's launch gives it (`tags`)."""

    attempt: int
    status: str
    ending_tags: dict[str, str]
    job_tags: dict[str, str]
    tags: dict[str, str]
    #: When the next attempt began (Unix milliseconds): the ending attempt's run ends there.
    at_ms: int


#: The exit a restart would have ended the attempt with, by the kind of change made in place.
CHANGE_EXITS = {
    "fallback": ExitCode.NUMERIC_FAULT,
    "repromote": ExitCode.REPROMOTE,
    "microBatch": ExitCode.OUT_OF_DEVICE_MEMORY,
}


def job_key(launch: AttemptLaunch) -> str:
    """What finds the job's run again from any attempt: the job's UID on a cluster; for a local
    run (no UID), a digest of its identity and checkpoint folder (one per `mpjob run --out`)."""
    if launch.job_uid:
        return launch.job_uid
    local = f"{launch.job_identity}|{launch.checkpoint_dir}"
    return "local-" + hashlib.sha256(local.encode()).hexdigest()[:16]


def job_params(launch: AttemptLaunch, *, digest: str, image: str) -> dict[str, str]:
    """The job's settings that make runs comparable (the reference's I6): precision and its
    ladder, loss scaling, the guard, the training shape, the config digest and the image."""
    spec = launch.spec
    p, scale, guard, tr = spec.precision, spec.precision.loss_scale, spec.precision.guard, spec.training
    params: dict[str, Any] = {
        "precision.mode": p.mode,
        "precision.ladder": ",".join([p.mode, *p.fallback]),
        "precision.keepFp32": ",".join(p.keep_fp32),
        "precision.tf32": p.tf32,
        "lossScale.init": scale.init,
        "lossScale.growthFactor": scale.growth_factor,
        "lossScale.backoffFactor": scale.backoff_factor,
        "lossScale.growthInterval": scale.growth_interval,
        "guard.maxConsecutiveOverflows": guard.max_consecutive_overflows,
        "guard.minLossScale": guard.min_loss_scale,
        "guard.maxNonFiniteLosses": guard.max_non_finite_losses,
        "training.steps": tr.steps,
        "training.batchSize": tr.batch_size,
        "training.gradAccumulation": tr.grad_accumulation,
        "training.learningRate": tr.learning_rate,
        "training.seed": tr.seed,
        "task": spec.task.builtin or spec.task.module or " ".join(spec.task.command or []),
        "workers": spec.workers,
        "configDigest": digest,
        "image": image or spec.image or "",
    }
    return {key: str(value)[:MAX_PARAM_CHARS] for key, value in params.items()}


def attempt_tags(launch: AttemptLaunch) -> dict[str, str]:
    return {TAG_ATTEMPT: str(launch.attempt), TAG_PRECISION: launch.precision}


def fallback_reason(rule: object, message: str, step: object) -> str:
    """The `mpjob.fallbackReason` of an attempt a numeric fault ended: the guard's rule, its
    message and the step."""
    return f"{rule}: {message} (step {step})"[:MAX_PARAM_CHARS]


def change_for(record: dict[str, Any]) -> Change:
    """What a `precisionChanged` line tells the tracking server: the ending of the attempt it
    ends, as that attempt's restart would have told it (its exit's reason and status and, for a
    fallback, the `fault` line's reason), and the tags of the attempt it begins."""
    code = CHANGE_EXITS[str(record.get("kind", "fallback"))]
    attempt, rule, step = int(record["attempt"]), str(record.get("rule", "")), record.get("step")
    ending = {TAG_ENDING: str(reason_for_exit_code(code))}
    job_tags: dict[str, str] = {}
    if code == ExitCode.NUMERIC_FAULT:  # its message is worded as the restart's report words it: "rule: ..."
        why = fallback_reason(rule, str(record.get("message", "")).removeprefix(f"{rule}: "), step)
        ending[TAG_FALLBACK_REASON] = job_tags[f"mpjob.fallback.attempt{attempt - 1}"] = why
    began = record.get("at")
    began = began if isinstance(began, int | float) else record.get("time", 0)
    return Change(
        attempt=attempt,
        status=run_status(code),
        ending_tags=ending,
        job_tags=job_tags,
        tags={TAG_ATTEMPT: str(attempt), TAG_PRECISION: str(record["toPrecision"])},
        at_ms=int(float(began) * 1000),
    )


def _points(record: dict[str, Any], names: dict[str, str], *, step: int, prefix: str = "") -> list[Point]:
    stamp = int(float(record.get("time", 0)) * 1000)
    points = []
    for metric, source in names.items():
        value = record.get(source)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        points.append(Point(prefix + metric, float(value), step, stamp))
    return points


def update_for(event: str, record: dict[str, Any], *, attempt: int) -> Update | None:
    """The records an event line makes (None: the event tells the tracking server nothing)."""
    step = record.get("step")
    if event == "step" and isinstance(step, int):
        update = Update(metrics=_points(record, STEP_METRICS, step=step))
        if isinstance(record.get("precision"), str):
            update.attempt_tags[TAG_PRECISION] = record["precision"]
        return update
    if event == "eval" and isinstance(step, int):
        return Update(metrics=_points(record, EVAL_METRICS, step=step))
    if event == "profile" and isinstance(step, int):
        share = {"low_precision_kernel_share": "lowPrecisionKernelShare"}
        return Update(metrics=_points(record, share, step=step))
    if event == "fault":
        why = fallback_reason(record.get("rule", ""), str(record.get("message", "")), step)
        return Update(attempt_tags={TAG_FALLBACK_REASON: why}, job_tags={f"mpjob.fallback.attempt{attempt}": why})
    if event == "dataSkipped" and (steps := _steps(record.get("steps"))):
        return skip_update(record, steps, attempt=attempt)
    if event == "precisionMeasured" and isinstance(record.get("precision"), str):
        return Update(attempt_tags={TAG_PRECISION: record["precision"]})
    return None


def _steps(value: Any) -> list[int]:
    """The steps a line names (none where it names something else)."""
    items = value if isinstance(value, list) else []
    return [step for step in items if isinstance(step, int) and not isinstance(step, bool)]


def skip_update(record: dict[str, Any], steps: list[int], *, attempt: int) -> Update:
    """A `dataSkipped` line: the run's skipped-step count as a metric at the last step skipped,
    and what was skipped (the attempt's last skip; the job's run, each attempt's) as tags."""
    total, last = record.get("skippedSteps"), max(steps)
    named = ", ".join(str(step) for step in steps)
    said = (
        f"{record.get('cause', 'data')}: step{'s' if len(steps) > 1 else ''} {named} skipped, trained on from the "
        f"checkpoint at step {record.get('fromStep')} ({total} step{'' if total == 1 else 's'} skipped so far)"
    )[:MAX_PARAM_CHARS]
    update = Update(attempt_tags={TAG_SKIPPED: said}, job_tags={f"{TAG_SKIPPED}.attempt{attempt}": said})
    if isinstance(total, int) and not isinstance(total, bool):
        stamp = int(float(record.get("time", 0)) * 1000)
        update.metrics.append(Point("skipped_steps", float(total), last, stamp))
    return update


def run_status(code: int) -> str:
    """The MLflow run status of an attempt that ended with exit `code`."""
    if code == ExitCode.SUCCESS:
        return "FINISHED"
    if code in (ExitCode.PREEMPTED, ExitCode.REPROMOTE):
        return "KILLED"
    return "FAILED"


#: The most params a `params_kept` message names (the rest are counted).
MAX_KEPT_NAMED = 5


def params_kept(held: dict[str, str], params: dict[str, str]) -> str | None:
    """What the job's run keeps of its `held` params where this attempt's `params` differ (the
    job's spec or image changed since the run began), said for a warning; None where none differ."""
    differ = [(name, held[name], value) for name, value in sorted(params.items()) if held.get(name, value) != value]
    if not differ:
        return None
    named = "; ".join(f"{name} {old!r:.80} (this attempt: {new!r:.80})" for name, old, new in differ[:MAX_KEPT_NAMED])
    more = f"; and {len(differ) - MAX_KEPT_NAMED} more" if len(differ) > MAX_KEPT_NAMED else ""
    return (
        f"ParamsKept: the job's run keeps the params it began with (MLflow keeps a param's first value), "
        f"not this attempt's: {named}{more}"
    )
