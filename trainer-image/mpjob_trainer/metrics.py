"""The trainer's Prometheus endpoint; names from mpjob_contract.metrics, one label set per
attempt (job, namespace, attempt, precision) so cardinality stays low. Also the device peaks
that MFU is measured against."""

from __future__ import annotations

import os
import resource
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from mpjob_contract import metrics as names
from mpjob_contract.faults import GuardRule
from mpjob_contract.report import CheckpointRef, InPlaceChange
from mpjob_contract.skipping import Skipped, spans_label
from mpjob_trainer import control
from mpjob_trainer.checkpoint.transfer import TRANSFER_BUCKETS

#: Dense bf16/fp16 tensor-core peaks (FLOP/s) for MFU, by device-name fragment.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40": 181e12, "A10": 125e12, "V100": 125e12, "T4": 65e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense tensor-core peak (for MFU), when it is a GPU this table knows."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


#: Gauges set once when the attempt starts (attribute, metric name): a relabel keeps their values.
HELD_AT_START = (
    ("start_step", names.START_STEP),
    ("step", names.STEP),
    ("total_steps", names.TOTAL_STEPS),
    ("last_good_step", names.LAST_GOOD_CHECKPOINT_STEP),
    ("recovery_seconds", names.RECOVERY_SECONDS),
)


class TrainerMetrics:
    def __init__(self, job: str, namespace: str, attempt: int, precision: str) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"job": job, "namespace": namespace, "attempt": str(attempt), "precision": precision}
        #: id(child) -> its family, so `relabel` can rebind every attribute to new labels.
        self._families: dict[int, Any] = {}
        self._training()
        self._checkpointing()
        self._bucket()
        self._decisions()
        self._instruments()
        self.info = self._bound(Gauge(names.INFO, "1 for the precision this attempt trains in.", **self._on()))
        self.info.set(1)
        self.port: int | None = None

    # -- the families, by what they tell ------------------------------------------------
    def _on(self, *extra: str) -> dict[str, Any]:
        """The label names (the attempt's, then `extra`) and the registry of a family."""
        return {"labelnames": [*self.labels, *extra], "registry": self.registry}

    def _bound(self, family: Any) -> Any:
        child = family.labels(**self.labels)
        self._families[id(child)] = family
        return child

    def _gauge(self, name: str, doc: str) -> Any:
        return self._bound(Gauge(name, doc, **self._on()))

    def _counter(self, name: str, doc: str) -> Any:
        return self._bound(Counter(name, doc, **self._on()))

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        return self._bound(Histogram(name, doc, **self._on(), buckets=buckets))

    def _training(self) -> None:
        gauge, counter = self._gauge, self._counter
        self.step = gauge(names.STEP, "Optimizer steps completed (the data position).")
        self.total_steps = gauge(names.TOTAL_STEPS, "Steps the job trains in all.")
        self.start_step = gauge(
            names.START_STEP, "The step this attempt resumed from (0 = fresh start; -1 until it has decided)."
        )
        self.start_step.set(-1)  # a read before the attempt decided must not look like a fresh start
        self.recovery_seconds = gauge(names.RECOVERY_SECONDS, "A restarted attempt: its predecessor's end to resumed.")
        self.recovery_seconds.set(-1)
        self.loss = gauge(names.LOSS, "Training loss at the last log interval.")
        self.loss_scale = gauge(names.LOSS_SCALE, "GradScaler loss scale (fp16 only).")
        self.overflow_steps = counter(names.OVERFLOW_STEPS, "Optimizer steps skipped for inf/NaN gradients.")
        self.non_finite = counter(names.NON_FINITE_LOSSES, "Steps with a NaN/Inf loss.")
        self.grad_norm = gauge(names.GRAD_NORM, "Global gradient norm before clipping (unscaled).")
        self.samples_per_second = gauge(names.SAMPLES_PER_SECOND, "Training throughput in samples/s.")
        self.tokens_per_second = gauge(names.TOKENS_PER_SECOND, "Training throughput in tokens/s.")
        self.mfu = gauge(names.MFU, "Model FLOPs utilization (0-1) where the flops and peak are known.")
        self.step_seconds = self._histogram(
            names.STEP_SECONDS,
            "Wall time of one optimizer step.",
            (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )
        self.peak_device_memory = gauge(names.PEAK_DEVICE_MEMORY, "Peak device memory allocated.")
        self.peak_host_memory = gauge(names.PEAK_HOST_MEMORY, "Peak resident host memory.")

    def _checkpointing(self) -> None:
        self.checkpoint_seconds = self._histogram(
            names.CHECKPOINT_SAVE_SECONDS,
            "Time to write one checkpoint (off the training thread when async).",
            (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.checkpoint_stall = self._histogram(
            names.CHECKPOINT_STALL_SECONDS,
            "Training-thread time of one periodic checkpoint (wait for the previous, capture, stage).",
            (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.checkpoint_bytes = self._gauge(names.CHECKPOINT_BYTES, "Size of the last checkpoint written.")
        self.checkpoint_failures = self._counter(names.CHECKPOINT_FAILURES, "Checkpoint writes that failed.")
        self.last_good_step = self._gauge(names.LAST_GOOD_CHECKPOINT_STEP, "Step of the newest verified checkpoint.")
        self.last_good_checkpoint = Gauge(
            names.LAST_GOOD_CHECKPOINT,
            "Step of the newest verified checkpoint, labelled with its sha256 and precision.",
            **self._on(*names.CHECKPOINT_LABELS),
        )
        self._last_good: CheckpointRef | None = None

    def _bucket(self) -> None:
        """Checkpoints in a bucket (checkpoint.s3's store reads these four)."""
        self.checkpoint_upload_seconds = self._histogram(
            names.CHECKPOINT_UPLOAD_SECONDS, "Time to upload one checkpoint and commit it.", TRANSFER_BUCKETS
        )
        self.checkpoint_upload_bytes = self._counter(names.CHECKPOINT_UPLOAD_BYTES, "Checkpoint bytes uploaded.")
        self.checkpoint_commit_failures = self._counter(
            names.CHECKPOINT_COMMIT_FAILURES, "Checkpoint uploads that ended without a commit."
        )
        self.checkpoint_restore_seconds = self._histogram(
            names.CHECKPOINT_RESTORE_SECONDS, "Time to download and verify one checkpoint.", TRANSFER_BUCKETS
        )

    def checkpoint_good(self, ref: CheckpointRef | None) -> None:
        """`ref` is the newest verified checkpoint (None: none is now): its step (0: none), its sha256
        and precision in the one series of last_good_checkpoint. The new series is set before the
        previous one goes, so a scrape in between sees both (readers take the newest step), never none."""
        self.last_good_step.set(0 if ref is None else ref.step)
        if ref is not None:
            self.last_good_checkpoint.labels(**self._checkpoint_labels(ref)).set(ref.step)
        previous, self._last_good = self._last_good, ref
        if previous is not None and (ref is None or self._checkpoint_labels(previous) != self._checkpoint_labels(ref)):
            self.last_good_checkpoint.remove(*self._checkpoint_labels(previous).values())

    def _checkpoint_labels(self, ref: CheckpointRef) -> dict[str, str]:
        return {**self.labels, "sha256": ref.sha256, "checkpoint_precision": ref.precision}

    def _decisions(self) -> None:
        """The guard, the fp32 replay, the `auto` probe and the quality gate."""
        gauge, counter = self._gauge, self._counter
        self.guard_trips = Counter(
            names.GUARD_TRIPS, "Numeric guard decisions that ended a precision, by rule.", **self._on("rule")
        )
        self.replays = Counter(
            names.REPLAYS,
            "fp32 replays of a numeric fault, by verdict (precision, data, inconclusive).",
            **self._on("verdict"),
        )
        self.replay_seconds = gauge(names.REPLAY_SECONDS, "Duration of the last fp32 replay.")
        self.skipped_samples = Counter(
            names.SKIPPED_SAMPLES,
            "Samples quarantined after a rollback, by cause (data: non-finite in fp32 too; spike: a loss spike).",
            **self._on("cause"),
        )
        self.skipped_non_finite = counter(
            names.SKIPPED_NON_FINITE_LOSSES,
            "Non-finite losses of steps rolled back and skipped (the attempt goes on in its precision).",
        )
        self._quarantine_metrics()
        self.precision_change = Gauge(
            names.PRECISION_CHANGE,
            "A change made in place (a fallback, a re-promotion, a smaller micro-batch; value: its recovery seconds),"
            " under the labels of the attempt it began.",
            **self._on(*names.PRECISION_CHANGE_LABELS),
        )
        self.measured = Gauge(
            names.MEASURED_STEP_SECONDS,
            "auto: seconds per step measured on this node, by candidate precision (-1: non-finite).",
            **self._on("candidate"),
        )
        self.eval_loss = gauge(names.EVAL_LOSS, "Quality gate: eval loss in the attempt's precision (-1: none yet).")
        self.eval_loss_fp32 = gauge(names.EVAL_LOSS_FP32, "Quality gate: eval loss in fp32 at the same weights.")
        self.eval_loss_delta = gauge(names.EVAL_LOSS_DELTA, "Quality gate: relative delta of the two (-1: none yet).")
        self.eval_seconds = counter(names.EVAL_SECONDS, "Seconds spent evaluating for the quality gate.")
        self.evaluated(-1, -1, -1, 0.0)  # none yet: -1, which the operator skips (a fresh 0 reads as a loss)

    def _quarantine_metrics(self) -> None:
        """The run's quarantine as the trainer holds it now (what the operator writes to status.skipped)."""
        self.quarantine_steps = self._gauge(names.QUARANTINE_STEPS, "Steps the run skipped so far (all attempts).")
        self.quarantine_samples = self._gauge(names.QUARANTINE_SAMPLES, "Samples the run quarantined so far.")
        self.quarantined_step = Gauge(
            names.QUARANTINED_STEP,
            "A skipped step (its place in the quarantine), labelled with its step, cause and first sample ranges.",
            **self._on(*names.QUARANTINED_STEP_LABELS),
        )
        self._quarantine: Skipped | None = None

    def quarantined(self, record: Skipped) -> None:
        """Show `record` (the quarantine's bounded summary), replacing what was shown. A scrape
        in between may see part of it: readers only ever add what a scrape shows."""
        self._quarantine = record
        self.quarantined_step.clear()
        for place, skip in enumerate(record.steps, start=1):
            labels = {"step": str(skip.step), "cause": skip.cause, "samples": spans_label(skip.samples)}
            self.quarantined_step.labels(**self.labels, **labels).set(place)
        self.quarantine_steps.set(record.count)
        self.quarantine_samples.set(record.samples)

    def serve(self, ask: control.Ask | None = None, token: str | None = None) -> int | None:
        """Serve on MPJOB_METRICS_HOST:MPJOB_METRICS_PORT; port 0 picks a free port. `ask`
        answers the operator's profile requests on the same port, those that carry `token`
        (mpjob_trainer.control)."""
        raw = os.environ.get(names.METRICS_PORT_ENV, str(names.DEFAULT_METRICS_PORT))
        port = control.port_setting(names.METRICS_PORT_ENV, raw)
        if port is None:
            return None
        host = os.environ.get("MPJOB_METRICS_HOST", "0.0.0.0")
        self.port = control.serve(port, host, control.routes(self.registry, ask, token))
        return self.port

    def _instruments(self) -> None:
        """Profiles on demand and experiment tracking (mpjob_trainer.profiling, .tracking)."""
        self.low_precision_share = self._gauge(
            names.LOW_PRECISION_KERNEL_SHARE, "Share of the last profile's kernel time in fp16/bf16/fp8 (-1: none)."
        )
        self.low_precision_share.set(-1)
        self.tracking_failures = self._counter(names.TRACKING_FAILURES, "Tracking-server calls that failed.")
        self.tracking_dropped = self._counter(names.TRACKING_DROPPED, "Tracking updates dropped: hand-off queue full.")

    def trip(self, rule: GuardRule) -> None:
        self.guard_trips.labels(**self.labels, rule=rule).inc()

    def changed(self, change: InPlaceChange) -> None:
        """The processes fell back in place: every attempt series moves to the attempt it began
        (`relabel`), at the step it began from, and the change's series is set under its labels."""
        self.relabel(change.to_precision, attempt=change.attempt)
        self.start_step.set(change.start_step)
        self.step.set(change.start_step)  # until it trains: its fresh gauges (a loss of 0) are no reading
        self.recovery_seconds.set(change.recovery_seconds)
        fields = change.model_dump(mode="json")
        values = {name: "" if fields[name] is None else str(fields[name]) for name in names.PRECISION_CHANGE_LABELS}
        self.precision_change.labels(**self.labels, **values).set(change.recovery_seconds)

    def relabel(self, precision: str, *, attempt: int | None = None) -> None:
        """Train under another `precision` label (an `auto` attempt measured its device), and `attempt` (one begun
        in place): every series moves to the new label set; what counted under the old one ends with it, but the
        gauges set when the attempt started (where it began, its goal, its last checkpoint) are carried over."""
        old, checkpoint = dict(self.labels), self._last_good
        held = {attr: self.registry.get_sample_value(name, old) for attr, name in HELD_AT_START}
        self.last_good_checkpoint.clear()
        self._last_good = None
        self.labels["precision"] = precision
        if attempt is not None:
            self.labels["attempt"] = str(attempt)
        for name, child in list(vars(self).items()):
            family = self._families.pop(id(child), None)
            if family is None:
                continue
            family.remove(*old.values())
            fresh = family.labels(**self.labels)
            self._families[id(fresh)] = family
            setattr(self, name, fresh)
        for attr, value in held.items():
            if value is not None:
                getattr(self, attr).set(value)
        self.evaluated(-1, -1, -1, 0.0)  # the gate has not evaluated under these labels either,
        self.low_precision_share.set(-1)  # nor a profile measured them: a fresh 0 reads as no low-precision kernel
        self.info.set(1)
        if checkpoint is not None:
            self.checkpoint_good(checkpoint)
        if self._quarantine is not None:  # a resumed attempt's quarantine, under the new label
            self.quarantined(self._quarantine)

    def measured_steps(self, seconds: dict[str, float | None]) -> None:
        for candidate, value in seconds.items():
            self.measured.labels(**self.labels, candidate=candidate).set(-1 if value is None else value)

    def evaluated(self, loss: float, loss_fp32: float, delta: float, seconds: float) -> None:
        self.eval_loss.set(loss)
        self.eval_loss_fp32.set(loss_fp32)
        self.eval_loss_delta.set(delta)
        self.eval_seconds.inc(seconds)

    def replayed(self, verdict: str, seconds: float) -> None:
        self.replays.labels(**self.labels, verdict=verdict).inc()
        self.replay_seconds.set(seconds)

    def skipped(self, cause: str, samples: int) -> None:
        """A skipped step's samples (a step skipped whole, its loop naming none: the step's count)."""
        self.skipped_samples.labels(**self.labels, cause=cause).inc(samples)

    def forgave(self, non_finite_losses: int) -> None:
        """Non-finite losses a skip rolled back: they no longer count against the precision."""
        self.skipped_non_finite.inc(non_finite_losses)

    def sample_host_memory(self) -> None:
        self.peak_host_memory.set(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
