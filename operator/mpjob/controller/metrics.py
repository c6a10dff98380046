"""Operator metrics (prometheus-client), served by `mpjob operator` on --metrics-port."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mpjob.planning.plan import Plan, Started
    from mpjob_contract.api import MixedPrecisionJobStatus

RECONCILE_SECONDS = Histogram(
    "mpjob_operator_reconcile_duration_seconds",
    "Time to reconcile one MixedPrecisionJob.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
ATTEMPTS_STARTED = Counter(
    "mpjob_operator_attempts_started",
    "Attempts started, by why (Created, NumericFault, Preempted, Resumed, ...).",
    ["reason"],
)
ATTEMPTS_ENDED = Counter(
    "mpjob_operator_attempts_ended",
    "Attempts ended, by reason (NumericFault, Succeeded, ConfigError, ...).",
    ["reason"],
)
FALLBACKS = Counter(
    "mpjob_operator_precision_fallbacks",
    "Precision fallbacks (down the ladder after a fault), by from and to precision.",
    ["from_precision", "to_precision"],
)
REPROMOTIONS = Counter(
    "mpjob_operator_precision_repromotions",
    "Re-promotions (back up the ladder after precision.repromoteAfterSteps clean steps), by from and to precision.",
    ["from_precision", "to_precision"],
)
JOBS_BY_PHASE = Gauge("mpjob_operator_jobs", "MixedPrecisionJobs this operator watches, by phase.", ["phase"])
JOBS_IN_TROUBLE = Gauge(
    "mpjob_operator_jobs_in_trouble",
    "MixedPrecisionJobs this operator watches whose next attempt waits out a backoff (BackingOff), whose "
    "checkpoints lapsed (CheckpointsFailing), or whose attempt's pods cannot be created or started (FailedCreate, "
    "CreateContainerConfigError, ImagePullBackOff), by that condition.",
    ["condition"],
)
ERRORS = Counter("mpjob_operator_errors", "Reconcile errors, by kind.", ["kind"])
RETRIES = Counter(
    "mpjob_operator_reconcile_retries",
    "Reconciles put back for a later retry (per-job exponential backoff), by the kind of error.",
    ["kind"],
)
REFUSALS = Counter(
    "mpjob_operator_children_refused",
    "Attempt children the API server refused for good (the job failed), by reason.",
    ["reason"],
)
SCRAPE_FAILURES = Counter("mpjob_operator_progress_scrape_failures", "Failed reads of a trainer's metrics endpoint.")
PODS_CUT = Counter(
    "mpjob_operator_pods_cut", "Pods deleted with a short grace: a rank of their attempt lost, hung, crashed."
)
QUEUE_DEPTH = Gauge("mpjob_operator_workqueue_depth", "MixedPrecisionJobs waiting for a reconcile (changes and ticks).")
GPU_SECONDS = Counter(
    "mpjob_operator_gpu_seconds",
    "GPU-seconds of ended attempts (pods x GPUs x the seconds their trainers ran), by the attempt's ending.",
    ["outcome"],
)
WASTED_GPU_SECONDS = Counter(
    "mpjob_operator_wasted_gpu_seconds",
    "GPU-seconds that bought nothing kept: rollback (steps a later attempt trained again), setup (an attempt "
    "that ended without success before its first step).",
    ["reason"],
)
GPU_COST = Counter(
    "mpjob_operator_gpu_cost",
    "gpu_seconds at the job's spec.costPerGpuHour (jobs with a price only), by currency and ending.",
    ["currency", "outcome"],
)
WASTED_GPU_COST = Counter(
    "mpjob_operator_wasted_gpu_cost",
    "wasted_gpu_seconds at the job's spec.costPerGpuHour (jobs with a price only), by currency and why.",
    ["currency", "reason"],
)


def count_started(started: Sequence[Started]) -> None:
    """Attempts said started: counted by why each began (Created, NumericFault, Resumed, ...)."""
    for attempt in started:
        ATTEMPTS_STARTED.labels(reason=attempt.reason).inc()


def count_plan(old: MixedPrecisionJobStatus, plan: Plan) -> None:
    """The operator's attempt metrics for what the plan started, fell back from and ended."""
    count_started(plan.started)
    for src, dst in plan.fallbacks:
        FALLBACKS.labels(from_precision=src, to_precision=dst).inc()
    for src, dst in plan.repromotions:
        REPROMOTIONS.labels(from_precision=src, to_precision=dst).inc()
    before = {attempt.index: attempt.reason for attempt in old.attempts}
    for after in plan.status.attempts:
        if after.reason is not None and before.get(after.index) is None:
            ATTEMPTS_ENDED.labels(reason=after.reason).inc()
