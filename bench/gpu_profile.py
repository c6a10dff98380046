"""Where a trainer step's time goes, for bench/trainer_gpu.py: read from the trace the trainer
wrote itself when asked for a profile on demand (mpjob_trainer.profiling, as the operator asks
for one), of steps after the run's measured windows: no compile, warm-up or final save inside.

On CUDA its kernels (and device copies) are grouped by kind (matmuls, attention, the amax
reductions of fp8's scales, inductor's fused kernels, the optimizer, copies) and set against the
measured step time: the kernels' seconds per step over the median step time is how busy the GPU
was, and the rest is the host's (launches, Python, syncs). A low MFU with a busy GPU is the
kernels' (shapes too small for the tensor cores); with an idle one, the host's. fp8's own
matmuls are those `aten::_scaled_mm` launched, and the low-precision share is the trainer's own
figure (M11, mpjob_trainer.profiling.kernels). On the CPU (--tiny) the CPU operators' self times
stand in for kernels: the code path only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mpjob_trainer.profiling.kernels import kernel_time, launches, timed_events

#: Kernel name fragments of each kind, first match wins (lower case).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("matmul", ("gemm", "matmul", "xmma", "cutlass", "nvjet", "wgmma", "addmm", "scaled_mm")),
    ("amax", ("amax",)),  # fp8's scales; before fused: inductor names its kernels after their ops
    ("fused (inductor)", ("triton",)),  # before copy: inductor names its kernels after their ops
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("copy", ("memcpy", "memset", "copy_")),
)
#: Trace categories of the device's own work: kernels, and copies and fills between memories.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
#: The operator that runs fp8 matmuls (torchao's float8 linears call it).
FP8_MATMUL = "aten::_scaled_mm"
#: Kernels named in the result, by their own time.
TOP = 12


def kind_of(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, parts in KINDS if any(part in lower for part in parts)), "other")


def work_rows(events: list[dict[str, Any]]) -> tuple[list[tuple[str, float, str | None]], bool]:
    """(name, seconds, launching operator) of each kernel, copy or fill; on a trace without
    them (a CPU), of each CPU operator by its self time. And whether they were the device's."""
    rows = [(e["name"], us / 1e6, op.get("name") if op else None) for e, op, us in launches(events, DEVICE_CATEGORIES)]
    return rows, any(e.get("cat") in DEVICE_CATEGORIES for e in events)


def summed(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for key, seconds in rows:
        totals[key] = totals.get(key, 0.0) + seconds
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def captured_step_seconds(events: list[dict[str, Any]], steps: int) -> float | None:
    """The wall time of a captured step: the span of the host's operators over the steps (the
    capture starts and stops at step boundaries)."""
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    if not ops or not steps:
        return None
    return (max(e["ts"] + e["dur"] for e in ops) - min(e["ts"] for e in ops)) / 1e6 / steps


def trace_breakdown(trace: dict[str, Any], *, steps: int, step_s: float | None, label: str) -> dict[str, Any]:
    """Where the time of `steps` captured steps of `label` went; `step_s`: the measured step
    time (the windows before the capture), against which the device's busy share is set."""
    events = timed_events(trace)
    rows, cuda = work_rows(events)
    busy = sum(seconds for _, seconds, _ in rows) or None
    by_kind = summed((kind_of(name), seconds) for name, seconds, _ in rows)
    by_name = summed((name, seconds) for name, seconds, _ in rows)
    fp8 = sum(seconds for _, seconds, op in rows if op == FP8_MATMUL)
    per_step = busy / steps if busy and steps else None
    return {
        "precision": label,
        "steps": steps,
        "stepSeconds": step_s,
        "capturedStepSeconds": captured_step_seconds(events, steps),
        "busySecondsPerStep": per_step,
        "busyShare": per_step / step_s if per_step is not None and step_s else None,
        "byKind": {kind: seconds / busy for kind, seconds in by_kind.items()} if busy else {},
        "byKindSecondsPerStep": {kind: seconds / steps for kind, seconds in by_kind.items()} if steps else {},
        "fp8MatmulShare": fp8 / busy if busy else None,
        "lowPrecisionShare": kernel_time(trace).low_share,
        "top": [[name[:100], seconds / steps if steps else seconds] for name, seconds in list(by_name.items())[:TOP]],
        "device": "cuda" if cuda else "cpu",
    }


def profile_lines(figures: dict[str, Any]) -> list[str]:
    """The profile as printed by bench/trainer_gpu.py."""
    if "unavailable" in figures:
        return [f"profile of {figures['precision']} steps: none written ({figures['unavailable']})"]
    what = "kernels" if figures["device"] == "cuda" else "CPU operators (no CUDA: the code path only)"
    lines = [f"profile of {figures['steps']} {figures['precision']} steps, {what} by kind (ms/step, share):"]
    per_step, by_kind = figures["byKindSecondsPerStep"], figures["byKind"]
    lines += [f"  {kind:<18} {per_step[kind] * 1e3:8.3f} ms  {share * 100:5.1f} %" for kind, share in by_kind.items()]
    if figures["busyShare"] is not None:
        lines.append(
            f"  busy {figures['busySecondsPerStep'] * 1e3:.2f} ms of a {figures['stepSeconds'] * 1e3:.2f} ms step: "
            f"{figures['busyShare'] * 100:.1f} %"
        )
    if figures["capturedStepSeconds"] is not None:
        captured = figures["capturedStepSeconds"] * 1e3
        lines.append(f"  a captured step took {captured:.2f} ms (the profiler's own cost in)")
    shares = [("fp8 matmuls (aten::_scaled_mm)", figures["fp8MatmulShare"]),
              ("low precision", figures["lowPrecisionShare"])]  # fmt: skip
    lines += [f"  {name} {share * 100:.1f} % of the time" for name, share in shares if share is not None]
    lines += [f"  {seconds * 1e3:8.3f} ms/step  {name}" for name, seconds in figures["top"]]
    return lines
