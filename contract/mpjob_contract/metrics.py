"""Names of the trainer's Prometheus metrics, defined once for the trainer, the operator,
the dashboards, the alert rules and docs/metrics.md."""

from __future__ import annotations

METRICS_PORT_ENV = "MPJOB_METRICS_PORT"
DEFAULT_METRICS_PORT = 9400

PREFIX = "mpjob_trainer_"

STEP = PREFIX + "step"
LOSS = PREFIX + "loss"
LOSS_SCALE = PREFIX + "loss_scale"
OVERFLOW_STEPS = PREFIX + "overflow_steps"  # counter -> *_total
NON_FINITE_LOSSES = PREFIX + "non_finite_losses"  # counter -> *_total
GRAD_NORM = PREFIX + "grad_norm"
SAMPLES_PER_SECOND = PREFIX + "samples_per_second"
TOKENS_PER_SECOND = PREFIX + "tokens_per_second"
MFU = PREFIX + "mfu_ratio"
STEP_SECONDS = PREFIX + "step_seconds"  # histogram
PEAK_DEVICE_MEMORY = PREFIX + "peak_device_memory_bytes"
PEAK_HOST_MEMORY = PREFIX + "peak_host_memory_bytes"
CHECKPOINT_SAVE_SECONDS = PREFIX + "checkpoint_save_seconds"  # histogram
#: Seconds the training thread spends in one periodic checkpoint save: waiting for the
#: previous save, capturing and staging the state (the write runs in the background).
CHECKPOINT_STALL_SECONDS = PREFIX + "checkpoint_stall_seconds"  # histogram
CHECKPOINT_BYTES = PREFIX + "checkpoint_bytes"
CHECKPOINT_FAILURES = PREFIX + "checkpoint_failures"  # counter -> *_total
LAST_GOOD_CHECKPOINT_STEP = PREFIX + "last_good_checkpoint_step"
#: The same step, labelled with the checkpoint's sha256 and precision (one series at a time):
#: what the operator writes to status.lastCheckpoint while the attempt runs.
LAST_GOOD_CHECKPOINT = PREFIX + "last_good_checkpoint"
CHECKPOINT_LABELS = ("sha256", "checkpoint_precision")
#: Checkpoints in a bucket (checkpoint.storage.s3): one upload's seconds (all files and the
#: manifest), the bytes uploaded, uploads that ended without a commit, one restore's seconds
#: (download and verification of a checkpoint).
CHECKPOINT_UPLOAD_SECONDS = PREFIX + "checkpoint_upload_seconds"  # histogram
CHECKPOINT_UPLOAD_BYTES = PREFIX + "checkpoint_upload_bytes"  # counter -> *_total
CHECKPOINT_COMMIT_FAILURES = PREFIX + "checkpoint_commit_failures"  # counter -> *_total
CHECKPOINT_RESTORE_SECONDS = PREFIX + "checkpoint_restore_seconds"  # histogram
TOTAL_STEPS = PREFIX + "total_steps"
START_STEP = PREFIX + "start_step"  # the step this attempt resumed from
#: A restarted attempt: seconds from the previous attempt's end (its report's endedAt) to this
#: one resumed (-1: not a recovery, or not resumed yet); the operator's attempts[].recoverySeconds.
RECOVERY_SECONDS = PREFIX + "recovery_seconds"
INFO = PREFIX + "precision"  # info-style gauge, label precision=..., value 1
GUARD_TRIPS = PREFIX + "guard_trips"  # counter by rule -> *_total
REPLAYS = PREFIX + "fp32_replays"  # counter by verdict (precision|data|inconclusive) -> *_total
REPLAY_SECONDS = PREFIX + "fp32_replay_seconds"  # gauge: the last replay's duration
#: Samples quarantined after a rollback (guard.onBadData, guard.spike), by cause (data|spike).
SKIPPED_SAMPLES = PREFIX + "skipped_samples"  # counter -> *_total
#: Non-finite losses of steps the data rung rolled back and skipped: the attempt went on in its
#: precision, so the NumericFaultHalt alert does not hold them against it.
SKIPPED_NON_FINITE_LOSSES = PREFIX + "skipped_non_finite_losses"  # counter -> *_total
#: The run's quarantine as the trainer holds it now, also what earlier attempts skipped (it is
#: in the checkpoints): steps and samples skipped, and the first skipping.MAX_SKIPPED_ENTRIES
#: steps, one series each (value: its place in the quarantine, 1-based), labelled with the step,
#: its cause and its first ranges of samples (skipping.spans_label). The operator writes them
#: to status.skipped while the attempt runs.
QUARANTINE_STEPS = PREFIX + "quarantine_steps"
QUARANTINE_SAMPLES = PREFIX + "quarantine_samples"
QUARANTINED_STEP = PREFIX + "quarantined_step"
QUARANTINED_STEP_LABELS = ("step", "cause", "samples")
#: Changes made in place (spec.precision.inPlace; report.InPlaceChange: fallbacks, re-promotions,
#: smaller micro-batches): one series per change, value its recoverySeconds, under the labels of
#: the attempt it began (its `attempt` and `precision`) and the change's fields; an attempt's
#: later relabel leaves them. The operator records a change it reads here as the restart path's
#: attempt entry.
PRECISION_CHANGE = PREFIX + "precision_change"
PRECISION_CHANGE_LABELS = ("kind", "step", "start_step", "from_precision", "to_precision", "rule", "message", "at")
#: `auto` attempts: seconds per step measured on the node, by candidate precision (label
#: `candidate`; -1 = it went non-finite); the chosen one is the attempt's `precision` label.
MEASURED_STEP_SECONDS = PREFIX + "measured_step_seconds"
#: The quality gate (spec.validation): eval loss in the attempt's precision, in fp32 at the
#: same weights, their relative delta (-1 until the first evaluation), and seconds spent.
EVAL_LOSS = PREFIX + "eval_loss"
EVAL_LOSS_FP32 = PREFIX + "eval_loss_fp32"
EVAL_LOSS_DELTA = PREFIX + "eval_loss_delta"
EVAL_SECONDS = PREFIX + "eval_seconds"  # counter -> *_total
#: Profiles on demand (the mpjob.dev/profile-steps annotation): the share of the last profile's
#: kernel time in fp16/bf16/fp8 kernels (-1 until one was taken); the kernel-fallback figure.
LOW_PRECISION_KERNEL_SHARE = PREFIX + "low_precision_kernel_share"
#: Experiment tracking (spec.tracking): calls to the tracking server that failed, and updates
#: dropped because the hand-off queue was full; neither ever stops training.
TRACKING_FAILURES = PREFIX + "tracking_failures"  # counter -> *_total
TRACKING_DROPPED = PREFIX + "tracking_dropped"  # counter -> *_total

#: Labels every trainer metric carries (low cardinality: one value per attempt).
LABELS = ("job", "namespace", "attempt", "precision")
