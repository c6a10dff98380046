"""The training loop, top to bottom: set up, resume, train, guard, checkpoint, report.

Per optimizer step the host never waits for the device except where GradScaler already
does (its found_inf check). Everything the log line, the metrics and the guard need is read
in one batch every `logEvery` steps (see guard.py), and checkpoints sync once when they
snapshot the state.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import random
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import CheckpointRef
from mpjob_trainer import distributed as dist_env
from mpjob_trainer.checkpoint import CheckpointStore, snapshot
from mpjob_trainer.data import StepSampler, micro_batch, to_device
from mpjob_trainer.errors import NumericFault, Preempted
from mpjob_trainer.events import EventLog
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.precision import PrecisionPolicy, keep_fp32, resolve
from mpjob_trainer.tasks import load_task

#: Dense bf16/fp16 tensor-core peaks (FLOP/s) for MFU, by device-name fragment.
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40": 181e12, "A10": 125e12, "V100": 125e12, "T4": 65e12}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense tensor-core peak (for MFU), when it is a GPU this table knows."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def config_digest(launch: AttemptLaunch) -> str:
    """What a checkpoint must agree with to be resumable: the model and the data order."""
    spec = launch.spec
    relevant = {
        "task": spec.task.to_api(),
        "seed": spec.training.seed,
        "batchSize": spec.training.batch_size,
        "gradAccumulation": spec.training.grad_accumulation,
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:16]


def learning_rate(applied_steps: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of the peak, driven by *applied* steps only,
    so overflow-skipped steps do not advance the schedule."""
    if warmup and applied_steps < warmup:
        return peak * (applied_steps + 1) / warmup
    progress = min(1.0, (applied_steps - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def rng_state() -> dict[str, Any]:
    np_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": list(random.getstate()),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *np_state[2:]],
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), *rest))


@dataclass
class RunResult:
    step: int
    precision: str
    loss: float | None
    checkpoint: CheckpointRef | None
    counters: dict[str, Any] = field(default_factory=dict)


class PreemptionFlag:
    """SIGTERM sets the flag; the loop finishes its step, checkpoints and exits 44."""

    def __init__(self) -> None:
        self.raised = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.raised = True


class Trainer:
    def __init__(self, launch: AttemptLaunch, log: EventLog | None = None) -> None:
        self.launch = launch
        self.spec = launch.spec
        self.world = dist_env.world_from_env()
        self.log = log or EventLog(self.world.rank)
        self.device = dist_env.pick_device(self.world)
        self.preemption = PreemptionFlag()
        self.counters: dict[str, Any] = {}
        self.step = 0
        self.checkpoint_failures = 0
        self.start_step = 0
        self.precision = launch.precision
        self.last_loss: float | None = None
        self.store: CheckpointStore | None = None

    # ---------------------------------------------------------------- set-up
    def run(self) -> RunResult:
        spec, launch = self.spec, self.launch
        self.preemption.install()
        dist_env.init_process_group(self.world, self.device)
        torch.manual_seed(spec.training.seed)  # identical initial weights on every rank
        precision = resolve(launch.precision, self.device)
        self.precision = precision
        policy = PrecisionPolicy(precision, self.device, spec.precision)
        policy.configure_backend()

        task = load_task(spec.task)
        model = task.model.to(self.device)  # fp32 master weights; autocast casts per op
        keep_fp32(model, spec.precision.keep_fp32, self.device)
        net: torch.nn.Module = (
            DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            if self.world.distributed
            else model
        )
        tr = spec.training
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=tr.learning_rate, betas=(0.9, 0.95), weight_decay=tr.weight_decay
        )
        scaler = policy.make_scaler()
        guard = NumericGuard(spec.precision.guard, self.device, self.world)
        applied = {"steps": 0}

        def on_applied(*_: Any) -> None:
            guard.optimizer_stepped()
            applied["steps"] += 1

        optimizer.register_step_post_hook(on_applied)

        store = CheckpointStore(Path(launch.checkpoint_dir), spec.checkpoint.keep, config_digest(launch), self.log)
        self.store = store
        if self.world.is_main:
            store.clean_stale()
        dist_env.barrier(self.world)

        start_step = 0
        loaded = store.load(launch.resume_from)
        if loaded is None:
            self.log("freshStart", reason="no valid checkpoint in " + str(store.root) + ": starting at step 0")
        else:
            ref, state = loaded
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            applied["steps"] = int(state["appliedSteps"])
            if scaler is not None and state.get("scaler") and state.get("precision") == "fp16":
                scaler.load_state_dict(state["scaler"])  # fp16 -> fp16 keeps its calibrated scale
            set_rng_state(state["rng"])
            start_step = ref.step
            self.log("resume", step=ref.step, path=ref.path, sha256=ref.sha256, fromPrecision=ref.precision)
        self.step = start_step
        self.start_step = start_step

        metrics = TrainerMetrics(launch.job_name, launch.namespace, launch.attempt, precision)
        port = metrics.serve() if self.world.is_main else None
        metrics.total_steps.set(tr.steps)
        metrics.step.set(start_step)
        metrics.start_step.set(start_step)
        if store.last_good is not None:
            metrics.last_good_step.set(store.last_good.step)
        self.log(
            "start",
            attempt=launch.attempt,
            precision=precision,
            requestedPrecision=launch.precision,
            device=str(self.device),
            worldSize=self.world.size,
            startStep=start_step,
            totalSteps=tr.steps,
            metricsPort=port,
        )

        sampler = StepSampler(
            len(task.dataset),  # type: ignore[arg-type]
            tr.batch_size,
            tr.grad_accumulation,
            self.world.size,
            self.world.rank,
            tr.seed,
        )
        params = [p for p in model.parameters() if p.requires_grad]
        clip = tr.grad_clip_norm if tr.grad_clip_norm > 0 else math.inf
        samples_per_step = tr.batch_size * tr.grad_accumulation * self.world.size
        peak = peak_flops(self.device)

        def state_dict(step: int) -> dict[str, Any]:
            return {
                "step": step,
                "appliedSteps": applied["steps"],
                "precision": precision,
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "rng": rng_state(),
            }

        def checkpoint(step: int, final: bool) -> None:
            """Snapshot on every rank's step boundary; rank 0 writes (async unless final)."""
            if self.world.is_main:
                self._collect(metrics, store, block=True)
                state = snapshot(state_dict(step))
                if final:
                    try:
                        result = store.save(step, precision, state)
                    except Exception as exc:
                        self._save_failed(metrics, step, exc)
                        raise  # no final checkpoint: this attempt cannot claim success
                    self._saved(metrics, result, asynchronous=False)
                else:
                    store.save_async(step, precision, state)
            if final:
                dist_env.barrier(self.world)

        # ------------------------------------------------------------ the loop
        grad_norm = torch.zeros((), device=self.device)
        window_start, window_steps = time.perf_counter(), 0
        try:
            for step in range(start_step, tr.steps):
                if task.set_step is not None:
                    task.set_step(step)
                guard.begin_step()
                lr = learning_rate(applied["steps"], tr.steps, tr.learning_rate, tr.warmup_steps)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                loss_sum = torch.zeros((), device=self.device)
                for micro in range(tr.grad_accumulation):
                    inputs, targets = to_device(micro_batch(task.dataset, sampler, step, micro), self.device)
                    last = micro == tr.grad_accumulation - 1
                    sync = contextlib.nullcontext() if (last or not self.world.distributed) else net.no_sync()  # type: ignore[operator]
                    with sync:
                        with policy.autocast():
                            loss = task.loss(net(inputs), targets) / tr.grad_accumulation
                        (scaler.scale(loss) if scaler is not None else loss).backward()
                    loss_sum += loss.detach().float()
                guard.observe_loss(loss_sum)
                if scaler is not None:
                    scaler.unscale_(optimizer)  # clipping sees true gradients
                grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
                if scaler is not None:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                done = step + 1
                self.step = done
                window_steps += 1
                try:
                    guard.end_step(done, scaler is not None)
                finally:
                    self.counters = {"overflowSteps": guard.overflow_steps, "nonFiniteLosses": guard.non_finite_losses}

                at_log = done % tr.log_every == 0 or done == tr.steps
                at_ckpt = done % self.spec.checkpoint.every_steps == 0 or done == tr.steps
                stop = self.preemption.raised and not self.world.distributed
                if at_log or at_ckpt or stop:
                    # The one sync point: loss, grad norm, guard counters, scale, preemption.
                    reading = guard.read(
                        scaler._scale if scaler is not None else None, flag=1.0 if self.preemption.raised else 0.0
                    )
                    loss_value = float(loss_sum.item())
                    norm_value = float(grad_norm.item())
                    self.last_loss = loss_value
                    self.counters = {
                        "overflowSteps": guard.overflow_steps,
                        "nonFiniteLosses": reading.non_finite_losses,
                        "lossScale": reading.loss_scale,
                    }
                    elapsed = time.perf_counter() - window_start
                    if self.world.is_main:
                        self._collect(metrics, store, block=False)
                    if at_log:
                        sps = samples_per_step * window_steps / elapsed if elapsed > 0 else None
                        self._log_step(
                            metrics,
                            done,
                            loss_value,
                            norm_value,
                            reading.loss_scale,
                            lr,
                            guard,
                            sps,
                            task.tokens_per_sample,
                            task.flops_per_sample,
                            peak,
                            elapsed / max(1, window_steps),
                            precision,
                        )
                        window_start, window_steps = time.perf_counter(), 0
                    guard.check(done, reading, loss_value, norm_value)
                    stop = reading.flag > 0
                    if at_ckpt or stop:
                        if guard.healthy(loss_value) and all(torch.isfinite(p).all() for p in params):
                            checkpoint(done, final=(done == tr.steps) or stop)
                        else:
                            self.log("checkpointSkipped", step=done, why="numeric trouble in this window")
                    if stop:
                        self.log("preempted", step=done)
                        raise Preempted(f"SIGTERM honoured at step {done}; checkpoint written")
            self.log("done", step=self.step, loss=self.last_loss)
        except NumericFault as fault:
            metrics.trip(fault.rule)
            self.log("fault", step=self.step, rule=fault.rule, message=str(fault), all_ranks=True)
            raise
        finally:
            if self.world.is_main:
                with contextlib.suppress(Exception):
                    self._collect(metrics, store, block=True)
        return RunResult(self.step, precision, self.last_loss, store.last_good, self.counters)

    # ---------------------------------------------------------------- reporting
    def _collect(self, metrics: TrainerMetrics, store: CheckpointStore, block: bool) -> None:
        """Report a finished asynchronous save (waiting for it with `block`), or count and log its
        failure and train on: the last good checkpoint stays the previous one, and the next
        interval tries again."""
        try:
            result = store.wait() if block else store.poll()
        except Exception as exc:
            self._save_failed(metrics, store.pending_step, exc)
            return
        if result is not None:
            self._saved(metrics, result, asynchronous=True)

    def _save_failed(self, metrics: TrainerMetrics, step: int, exc: Exception) -> None:
        metrics.checkpoint_failures.inc()
        self.checkpoint_failures += 1
        self.log(
            "checkpointFailed",
            step=step,
            trainingStep=self.step,
            error=f"{type(exc).__name__}: {exc}",
            failures=self.checkpoint_failures,
        )

    def _saved(self, metrics: TrainerMetrics, result: Any, asynchronous: bool) -> None:
        metrics.checkpoint_seconds.observe(result.seconds)
        metrics.checkpoint_bytes.set(result.bytes)
        metrics.last_good_step.set(result.ref.step)
        self.log(
            "checkpoint",
            step=result.ref.step,
            path=result.ref.path,
            sha256=result.ref.sha256,
            seconds=round(result.seconds, 4),
            bytes=result.bytes,
            **{"async": asynchronous},
        )

    def _log_step(
        self,
        metrics: TrainerMetrics,
        step: int,
        loss: float,
        grad_norm: float,
        scale: float | None,
        lr: float,
        guard: NumericGuard,
        sps: float | None,
        tokens_per_sample: int | None,
        flops_per_sample: float | None,
        peak: float | None,
        step_seconds: float,
        precision: str,
    ) -> None:
        tps = sps * tokens_per_sample if sps and tokens_per_sample else None
        mfu = sps * flops_per_sample / (peak * self.world.size) if sps and flops_per_sample and peak else None
        metrics.step.set(step)
        metrics.loss.set(loss)
        if scale is not None:
            metrics.loss_scale.set(scale)
        metrics.grad_norm.set(grad_norm)
        metrics.overflow_steps.inc(guard.overflow_steps - metrics.overflow_steps._value.get())
        metrics.non_finite.inc(guard.non_finite_losses - metrics.non_finite._value.get())
        if sps is not None:
            metrics.samples_per_second.set(sps)
        if tps is not None:
            metrics.tokens_per_second.set(tps)
        if mfu is not None:
            metrics.mfu.set(mfu)
        metrics.step_seconds.observe(step_seconds)
        peak_device = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        if peak_device is not None:
            metrics.peak_device_memory.set(peak_device)
        metrics.sample_host_memory()
        self.log(
            "step",
            step=step,
            loss=loss,
            lossScale=scale,
            gradNorm=grad_norm,
            lr=lr,
            overflowSteps=guard.overflow_steps,
            nonFiniteLosses=guard.non_finite_losses,
            samplesPerSecond=sps,
            tokensPerSecond=tps,
            mfu=mfu,
            stepSeconds=step_seconds,
            precision=precision,
            peakDeviceMemoryBytes=peak_device,
        )
