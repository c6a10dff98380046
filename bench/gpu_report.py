"""What bench/trainer_gpu.py prints and writes: the device, a row of figures per precision and
side, the guard A/B, the checkpoint stall and the host syncs, and the targets of
docs/benchmarks.md (they hold on H100/H200) beside the figures: "n/a (no CUDA)" for a figure
only CUDA has, "not measured" for one the run left out (--precisions, --parts).
"""

from __future__ import annotations

import dataclasses
import os
import platform
from pathlib import Path
from typing import Any

import torch

from bench.gpu_setup import CHECKPOINT_EVERY, CUDA, Figures, Setup

NA = "n/a (no CUDA)"
NOT_MEASURED = "not measured (left out of this run)"


def device_line() -> str:
    if CUDA:
        return f"device: {torch.cuda.get_device_name(0)} (CUDA {torch.version.cuda}); torch {torch.__version__}"
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    cpu = names[0] if names else platform.processor() or "unknown CPU"
    return f"device: CPU ({cpu}, {os.cpu_count()} cores), no CUDA; torch {torch.__version__}"


def percent(value: float | None) -> str:
    return f"{value * 100:.1f} %" if value is not None else NA


def row(label: str, side: str, f: Figures) -> str:
    memory = f"{f.peak_bytes / 2**30:.2f} GiB" if f.peak_bytes else NA
    how = {True: "compiled", False: "eager", None: "compile ?"}[f.compiled]
    return (
        f"{label:<10} {side:<8} {how:<9} {f.tokens_per_s:>12,.0f} tok/s {f.step_s * 1e3:>9.2f} ms/step  "
        f"MFU {percent(f.mfu):<14} peak memory {memory}"
    )


def targets(results: dict[str, dict[str, Figures]], extra: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(what, figure, target) for the targets of docs/benchmarks.md, which hold on H100/H200;
    "not measured" where this run left the figure out (--precisions, --parts)."""
    bf16, fp32 = (results[p]["mpjob"] if p in results else None for p in ("bf16", "fp32"))
    stall, syncs, guard = extra.get("checkpointStall"), extra.get("syncsPerStep"), extra.get("guard")
    ratio = extra.get("bf16VsNanoGPT")
    if stall:
        stall_figure = f"{stall['percent']:.2f} % at everySteps {stall['everySteps']}"
    else:
        stall_figure = "no checkpointStaged event" if bf16 else NOT_MEASURED
    if syncs is None:
        sync_figure = NOT_MEASURED
    else:
        sync_figure = " / ".join(f"{syncs[p]:g}" for p in ("bf16", "fp16")) if CUDA else NA
    return [
        ("bf16 MFU (mpjob)", percent(bf16.mfu) if bf16 else NOT_MEASURED, ">= 50 %"),
        ("bf16 tokens/s, mpjob / nanoGPT loop", f"{ratio:.3f}" if ratio else NOT_MEASURED, ">= 0.95"),
        ("bf16 / strict fp32 tokens/s (mpjob)",
         f"{bf16.tokens_per_s / fp32.tokens_per_s:.2f}x" if bf16 and fp32 else NOT_MEASURED, ">= 6x"),
        ("guard overhead (bf16 step time)", f"{guard['overheadPercent']:+.2f} %" if guard else NOT_MEASURED,
         "<= 0.5 %"),
        ("checkpoint stall (bf16)", stall_figure, f"<= 1 % at everySteps {CHECKPOINT_EVERY}"),
        ("host syncs per step (bf16 / fp16)", sync_figure, "0 / <= 1"),
    ]  # fmt: skip


def print_extras(extra: dict[str, Any]) -> None:
    guard, stall = extra.get("guard"), extra.get("checkpointStall")
    if guard:
        print(
            f"guard A/B ({guard['precision']}, {guard['pairs']} interleaved pairs of {guard['steps']}-step runs, "
            f"medians): guard on {guard['guardOnSeconds'] * 1e3:.3f} ms/step, per-step methods no-ops "
            f"{guard['guardOffSeconds'] * 1e3:.3f} ms/step: overhead {guard['overheadPercent']:+.2f} % of step time"
        )
    if "checkpointStall" in extra and stall is None:
        print("checkpoint stall (bf16): no checkpointStaged event (the run staged no save before its last step)")
    elif stall is not None:
        print(
            f"checkpoint stall (bf16, everySteps {stall['everySteps']}): {stall['saves']} save(s) staged, "
            f"{stall['stallSeconds'] * 1e3:.1f} ms blocked per save: {stall['percent']:.3f} % of training time"
        )
    if "syncsPerStep" in extra:
        syncs = ", ".join(f"{label} {count:g}" for label, count in extra["syncsPerStep"].items()) if CUDA else NA
        print(f"host syncs per step (set_sync_debug_mode): {syncs}")


def fp8_json(fp8: dict[str, Any]) -> dict[str, Any]:
    """bench.fp8_rows' figures as JSON (Figures as dicts)."""
    large = {label: dataclasses.asdict(f) for label, f in fp8["large"].items()}
    at_base = dataclasses.asdict(fp8["fp8"]) if "fp8" in fp8 else None
    return {"skipped": fp8["skipped"], "largeShape": fp8["largeShape"], "fp8": at_base, "large": large,
            "largeProfiles": fp8.get("largeProfiles", {})}  # fmt: skip


def compile_line(setup: Setup) -> str:
    baseline = "eager" if setup.compile == "never" else "torch.compile"
    return f"compile: trainer training.compile={setup.compile}; nanoGPT loop {baseline}"
