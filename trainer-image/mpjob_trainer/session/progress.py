"""Progress: what the run tells the world at each log interval, as metrics and event lines.

The same numbers go to the Prometheus endpoint (which the operator reads into the CR status)
and to the "step" event line (which `mpjob run` draws its view from); the event schema is
events.py's. Throughput is measured over the window since the previous log line, so a log
line costs no extra device sync: it is taken right after the guard's interval read.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Any

import torch

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import CheckpointRef
from mpjob_trainer.distributed import World, devices_of_every_rank
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics, peak_flops


@dataclass(frozen=True)
class Interval:
    """One log line's worth of numbers, read at the interval's sync point."""

    step: int
    precision: str
    loss: float | None
    loss_scale: float | None
    grad_norm: float | None
    lr: float | None
    overflow_steps: int
    non_finite_losses: int
    applied_steps: int


class ThroughputWindow:
    """Steps and samples since the window opened; samples/s and mean step time when it closes."""

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        self.started = time.perf_counter()
        self.steps = 0
        self.samples: int | None = 0

    def add(self, samples: int | None) -> None:
        self.steps += 1
        if samples is None or self.samples is None:
            self.samples = None  # one step without a count makes the window's rate unknown
        else:
            self.samples += samples

    def rates(self) -> tuple[float | None, float]:
        """(samples per second or None, seconds per step) over the window so far."""
        elapsed = time.perf_counter() - self.started
        sps = self.samples / elapsed if self.samples and elapsed > 0 else None
        return sps, elapsed / max(1, self.steps)


#: The SDK's calls that tell a sample's cost, and their names for (FLOPs, tokens).
COST_ARGUMENTS = {"start": ("flops_per_sample", "tokens_per_sample"), "set_sample_cost": ("flops", "tokens")}


def _above_zero(value: Any, kind: type[Any]) -> bool:
    """A finite number of `kind` above 0 (a bool is no count)."""
    return isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def sample_cost(flops: float | None, tokens: int | None, *, call: str) -> tuple[float | None, int | None]:
    """One sample's training FLOPs (MFU) and tokens (tokens/s) as told to `call`, when usable:
    else a ConfigError naming the argument and what it may be."""
    flops_name, tokens_name = COST_ARGUMENTS[call]
    if flops is not None and not _above_zero(flops, numbers.Real):
        raise ConfigError(
            f"{call}({flops_name}={flops!r}): {flops_name} is the training FLOPs of one sample (about 6 x "
            "parameters for a dense model; MFU is computed from it): a finite number above 0, or None when not known"
        )
    if tokens is not None and not _above_zero(tokens, numbers.Integral):
        raise ConfigError(
            f"{call}({tokens_name}={tokens!r}): {tokens_name} is the number of tokens in one sample (tokens/s "
            "is computed from it): an integer above 0, or None when not known"
        )
    return (float(flops) if flops is not None else None), (int(tokens) if tokens is not None else None)


class Progress:
    def __init__(self, metrics: TrainerMetrics, log: EventLog, world: World, device: torch.device) -> None:
        self.metrics = metrics
        self.log = log
        self.world = world
        self.device = device
        #: One sample's cost, when told (`cost`): MFU and tokens/s need it.
        self.flops_per_sample: float | None = None
        self.tokens_per_sample: int | None = None
        self.peak = peak_flops(device)
        self.window = ThroughputWindow()
        #: The labels the counters were told under, and what they were told so far (overflow
        #: steps, non-finite losses): Prometheus counters only go up, so each interval adds what
        #: the guard counted since the last.
        self.counted = (dict(metrics.labels), 0, 0)

    def cost(self, flops: float | None, tokens: int | None, *, call: str) -> None:
        """What one sample costs, as told to the SDK's `call` (`sample_cost`)."""
        self.flops_per_sample, self.tokens_per_sample = sample_cost(flops, tokens, call=call)

    def started(
        self,
        launch: AttemptLaunch,
        precision: str,
        start_step: int,
        last_good: CheckpointRef | None,
        recovered_in: float | None = None,
    ) -> None:
        """The "start" line and the gauges that hold for the whole attempt (`recovered_in`: a
        restart's recoverySeconds); opens the first window."""
        m = self.metrics
        m.total_steps.set(launch.spec.training.steps)
        m.step.set(start_step)
        m.start_step.set(start_step)
        if recovered_in is not None:
            m.recovery_seconds.set(recovered_in)
        if last_good is not None:
            m.checkpoint_good(last_good)
        self.log(
            "start",
            attempt=launch.attempt,
            precision=precision,
            requestedPrecision=launch.precision,
            device=str(self.device),
            devices=devices_of_every_rank(self.device, self.world),
            worldSize=self.world.size,
            startStep=start_step,
            totalSteps=launch.spec.training.steps,
            metricsPort=m.port,
        )
        self.window.restart()

    def report(self, interval: Interval) -> None:
        """Metrics and the "step" line for an interval; opens the next throughput window."""
        sps, step_seconds = self.window.rates()
        self.window.restart()
        tps = sps * self.tokens_per_sample if sps and self.tokens_per_sample else None
        flops, peak = self.flops_per_sample, self.peak
        mfu = sps * flops / (peak * self.world.size) if sps and flops and peak else None
        peak_memory = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        self._set_metrics(interval, sps, tps, mfu, step_seconds, peak_memory)
        self.log(
            "step",
            step=interval.step,
            loss=interval.loss,
            lossScale=interval.loss_scale,
            gradNorm=interval.grad_norm,
            lr=interval.lr,
            overflowSteps=interval.overflow_steps,
            nonFiniteLosses=interval.non_finite_losses,
            appliedSteps=interval.applied_steps,
            samplesPerSecond=sps,
            tokensPerSecond=tps,
            mfu=mfu,
            stepSeconds=step_seconds,
            precision=interval.precision,
            peakDeviceMemoryBytes=peak_memory,
        )

    def _set_metrics(
        self,
        interval: Interval,
        sps: float | None,
        tps: float | None,
        mfu: float | None,
        step_seconds: float,
        peak_memory: int | None,
    ) -> None:
        m = self.metrics
        m.step.set(interval.step)
        for gauge, value in (
            (m.loss, interval.loss),
            (m.loss_scale, interval.loss_scale),
            (m.grad_norm, interval.grad_norm),
            (m.samples_per_second, sps),
            (m.tokens_per_second, tps),
            (m.mfu, mfu),
            (m.peak_device_memory, peak_memory),
        ):
            if value is not None:
                gauge.set(value)
        labels, overflows, non_finite = self.counted
        if labels != m.labels:  # series under new labels start at 0 (TrainerMetrics.relabel): all is new to them
            overflows = non_finite = 0
        m.overflow_steps.inc(added(overflows, interval.overflow_steps))
        m.non_finite.inc(added(non_finite, interval.non_finite_losses))
        self.counted = (dict(m.labels), interval.overflow_steps, interval.non_finite_losses)
        m.step_seconds.observe(step_seconds)
        m.sample_host_memory()


def added(before: int, now: int) -> int:
    """What a guard count grew by since `before`; a count that fell was started afresh, and all
    of it is new. The process's counters only grow. (An attempt begun in place starts its guard
    afresh under new labels, whose series start at 0: `before` is 0 there, whatever the launched
    attempt's count was.)"""
    return now - before if now >= before else now


def host_value(value: torch.Tensor | float | None) -> float | None:
    """A device number as a host float (a sync: only at intervals)."""
    if value is None:
        return None
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)
