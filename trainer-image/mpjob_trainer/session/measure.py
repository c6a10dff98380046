"""PrecisionProbe: `auto` decided on the node, by measuring (failure mode F6: AMP slower than fp32).

When an attempt's precision is `auto`, the session times the loop's own step (the function
registered with `run.register_step`) on the attempt's next real batch in each precision the
device supports (fp32; bf16 on compute capability >= 8.0 and on CPU; fp16 on >= 7.0) and
trains in the fastest one that stayed finite. A low precision must beat fp32 by `MARGIN`
(mpjob_contract.launch.AUTO_MARGIN) to be chosen; when none does, the attempt trains in fp32
and says AMP was slower. On compute capability >= 8.9 fp8 is a candidate too (its linears
converted at set-up, compiled like the rest when training.compile compiles): it is chosen only
when it beats bf16 by the margin as well, since it is the less safe of the two.

Nothing a probe step does is kept: each candidate runs in the PROBE mode of the attempt's
precision state (session.modes), where `run.step()` only zeroes the gradients and the
attempt's own precision and GradScaler come back afterwards; module buffers (BatchNorm statistics,
and those a step rebinds to a new tensor) and every random generator are put back afterwards, and
the data position is the step index itself.
Each candidate runs `WARM` untimed steps (autocast caches, allocator, kernels chosen) then
`TIMED` timed ones; the median counts. On CUDA each timed step ends with a synchronize.

Cost: (WARM + TIMED) x candidates forward-backward passes, once per `auto` attempt.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from mpjob_contract.fp8 import fp8_capable
from mpjob_contract.launch import AUTO_MARGIN
from mpjob_contract.report import Measurement, amp_slower
from mpjob_trainer.distributed import World, all_reduce_max
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.generators import rng_state, set_rng_state
from mpjob_trainer.session.modes import Mode
from mpjob_trainer.session.steps import StepFunction

MARGIN = AUTO_MARGIN
WARM, TIMED = 1, 3


def measure_and_settle(step: StepFunction, index: int, *, modules: list[nn.Module], at: AttemptContext) -> Measurement:
    """Time the loop's `step(index)` in each candidate precision, keeping nothing it changes,
    and train in the one chosen from here on (every rank chooses alike)."""
    precision, tally = at.numerics.precision, at.numerics.tally
    device = precision.device

    def probe() -> bool:
        tally.clear()
        step(index)
        return tally.finite_and_clear(grad_norm=False)

    seconds: dict[str, float | None] = {}
    with nothing_kept(modules):
        for candidate in candidates(device, fp8=precision.fp8 is not None and bool(precision.fp8.names)):
            with precision.entered(Mode.PROBE, candidate):
                seconds[candidate] = time_steps(probe, device)
    measurement = choose(agreed_seconds(seconds, at.world, device))
    precision.settle(measurement.chosen)
    tally.clear()
    at.metrics.relabel(measurement.chosen)
    at.metrics.measured_steps(measurement.step_seconds)
    at.log("precisionMeasured", **measurement.model_dump(by_alias=True))
    return measurement


def candidates(device: torch.device, *, fp8: bool = False) -> list[str]:
    """The precisions this device can train in, the low ones first (fp8: the model has fp8 linears)."""
    if device.type != "cuda":
        return ["bf16", "fp32"]
    capability = torch.cuda.get_device_capability(device)
    low = (["bf16"] if capability >= (8, 0) else []) + (["fp16"] if capability >= (7, 0) else [])
    return [*(["fp8"] if fp8 and fp8_capable(capability) else []), *low, "fp32"]


def choose(seconds: dict[str, float | None], *, margin: float = MARGIN) -> Measurement:
    """The fastest finite low precision if it beats fp32 by `margin`, else fp32; bf16 over fp16
    unless fp16 beats it by `margin` too; fp8 only when it beats a finite bf16 by `margin` too."""
    fp32, bf16 = seconds.get("fp32"), seconds.get("bf16")
    low = {p: s for p, s in seconds.items() if p != "fp32" and s is not None}
    if "fp8" in low and bf16 is not None and low["fp8"] >= bf16 * (1 - margin):
        del low["fp8"]  # no faster than bf16 within the margin: bf16 is the safer of the two
    best = min(low, key=lambda p: low[p]) if low else None
    if best == "fp16" and low.get("bf16") is not None and low["fp16"] >= low["bf16"] * (1 - margin):
        best = "bf16"  # as fast within the margin, and it needs no loss scale
    if best is not None and (fp32 is None or low[best] < fp32 * (1 - margin)):
        return Measurement(step_seconds=seconds, chosen=best, amp_slower_than_fp32=False)
    return Measurement(step_seconds=seconds, chosen="fp32", amp_slower_than_fp32=amp_slower("fp32", seconds))


@contextmanager
def nothing_kept(modules: list[nn.Module]) -> Iterator[None]:
    """Put back every module buffer and random generator the block changes: each buffer's value,
    and the tensor itself where the block bound a new one to its name (a statistic kept out of place)."""
    buffers = [(m, name, b, b.detach().clone()) for m in modules for name, b in m.named_buffers()]
    rng = rng_state()
    try:
        yield
    finally:
        with torch.no_grad():
            for module, name, original, saved in buffers:
                original.copy_(saved)
                if module.get_buffer(name) is not original:
                    owner, _, leaf = name.rpartition(".")
                    setattr(module.get_submodule(owner), leaf, original)
        set_rng_state(rng)


def agreed_seconds(seconds: dict[str, float | None], world: World, device: torch.device) -> dict[str, float | None]:
    """Every rank's slowest time per candidate (non-finite on any rank: None), so all ranks choose alike."""
    if not world.distributed:
        return seconds
    names = list(seconds)
    packed = torch.tensor([seconds[n] if seconds[n] is not None else math.inf for n in names], device=device)
    worst = all_reduce_max(packed.to(torch.float64), world).tolist()
    return {n: (None if math.isinf(v) else v) for n, v in zip(names, worst, strict=True)}


def time_steps(run_step: Callable[[], bool], device: torch.device) -> float | None:
    """Median seconds of one step after the warm-up; None when a step went non-finite. Every
    step runs either way: under DDP each one's collectives must meet the other ranks'."""
    times, finite = [], True
    for i in range(WARM + TIMED):
        began = time.perf_counter()
        finite = run_step() and finite
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= WARM:
            times.append(time.perf_counter() - began)
    return statistics.median(times) if finite else None
