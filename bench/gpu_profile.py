"""Where a trainer step's time goes, for bench/trainer_gpu.py's `profile` part.

One in-process bf16 run (the graphs of the run before it reused: no compile inside) under
torch.profiler. On CUDA its kernels are grouped by kind (matmuls, attention, inductor's fused
kernels, the optimizer, copies) and set against the steps' own time: the kernels' seconds per
step over the median step time is how busy the GPU was, and the rest is the host's (launches,
Python, syncs). A low MFU with a busy GPU is the kernels' (shapes too small for the tensor
cores); with an idle one, the host's. On the CPU (--tiny) the CPU operators stand in for
kernels: the code path only.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

#: Kernel name fragments of each kind, first match wins (lower case).
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("matmul", ("gemm", "matmul", "xmma", "cutlass", "nvjet", "wgmma", "addmm")),
    ("fused (inductor)", ("triton",)),  # before copy: inductor names its kernels after their ops
    ("optimizer", ("adam", "foreach", "multi_tensor")),
    ("copy", ("memcpy", "memset", "copy_")),
)
#: Kernels named in the result, by their own time.
TOP = 12


def kind_of(name: str) -> str:
    lower = name.lower()
    return next((kind for kind, parts in KINDS if any(part in lower for part in parts)), "other")


def device_rows(prof: Any, cuda: bool) -> list[tuple[str, float]]:
    """(name, seconds) of each kernel (CUDA) or CPU operator (no CUDA), by own time."""
    rows = []
    for event in prof.key_averages():
        if cuda and getattr(event, "device_type", None) != DeviceType.CUDA:
            continue
        micros = getattr(event, "self_device_time_total", 0.0) if cuda else event.self_cpu_time_total
        if micros > 0:
            rows.append((event.key, micros / 1e6))
    return sorted(rows, key=lambda row: -row[1])


def step_profile(run: Callable[[], list[dict[str, Any]]], *, warmup: int, cuda: bool) -> dict[str, Any]:
    """Profile `run` (an in-process trainer run returning its events); its steps' breakdown."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        events = run()
    steps = [e for e in events if e["event"] == "step"]
    total = steps[-1]["step"] if steps else 0
    timed = [e["stepSeconds"] for e in steps if e["step"] > warmup and e.get("samplesPerSecond")]
    rows = device_rows(prof, cuda)
    busy = sum(seconds for _, seconds in rows)
    by_kind: dict[str, float] = {}
    for name, seconds in rows:
        kind = kind_of(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    step_s = statistics.median(timed) if timed else None
    per_step = busy / total if total else None
    return {
        "steps": total,
        "stepSeconds": step_s,
        "busySecondsPerStep": per_step,
        "busyShare": per_step / step_s if per_step is not None and step_s else None,
        "byKind": {kind: seconds / busy for kind, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "top": [[name[:100], seconds / total if total else seconds] for name, seconds in rows[:TOP]],
        "device": "cuda" if cuda else "cpu",
    }


def profile_lines(figures: dict[str, Any]) -> list[str]:
    """The profile as printed by bench/trainer_gpu.py."""
    what = "kernels" if figures["device"] == "cuda" else "CPU operators (no CUDA: the code path only)"
    lines = [f"profile of {figures['steps']} bf16 steps, {what} by kind (share of their time):"]
    lines += [f"  {kind:<18} {share * 100:5.1f} %" for kind, share in figures["byKind"].items()]
    if figures["busyShare"] is not None:
        lines.append(
            f"  busy {figures['busySecondsPerStep'] * 1e3:.2f} ms of a {figures['stepSeconds'] * 1e3:.2f} ms step: "
            f"{figures['busyShare'] * 100:.1f} %"
        )
    lines += [f"  {seconds * 1e3:8.3f} ms/step  {name}" for name, seconds in figures["top"]]
    return lines
