"""GPU throughput of the trainer: `gpt` 124M (12 layers, 768 wide, sequence 1024) in fp32 with
TF32 off and on, fp16 and bf16, side by side with a minimal nanoGPT-style loop over the same
model as the baseline. Prints tokens/s, MFU and peak memory per precision, and the two targets
(bf16 MFU >= 50% on H100/H200; bf16 >= 6x strict fp32).

The trainer runs as `python -m mpjob_trainer` (what the pod runs) with its numeric guard,
checkpoints and metrics; its figures come from its own step events after a warm-up window.

    PYTHONPATH=. python bench/trainer_gpu.py            # on a CUDA machine
    PYTHONPATH=. python bench/trainer_gpu.py --tiny     # CPU smoke run of the same code paths
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import torch

from bench.baseline import amp_update
from mpjob_trainer.loop import peak_flops
from mpjob_trainer.tasks.gpt import make_task

GPT_124M = {"nLayer": 12, "nHead": 12, "nEmbd": 768, "blockSize": 1024}
TINY = {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 64, "corpusBytes": 50_000}
PRECISIONS = [("fp32", False), ("fp32", True), ("fp16", False), ("bf16", False)]


def trainer_run(args: dict[str, Any], precision: str, tf32: bool, batch: int, steps: int, log_every: int) -> dict:
    spec = {
        "task": {"builtin": "gpt", "args": args},
        "training": {"steps": steps, "batchSize": batch, "logEvery": log_every, "learningRate": 3e-4},
        "precision": {"mode": precision, "tf32": tf32},
        "checkpoint": {"everySteps": 10 * steps, "keep": 1},
        "resources": {"gpusPerWorker": 1 if torch.cuda.is_available() else 0},
    }
    with tempfile.TemporaryDirectory() as tmp:
        launch = {"jobName": "bench", "attempt": 0, "precision": precision, "spec": spec}
        launch["checkpointDir"] = f"{tmp}/ckpt"
        env = {
            **os.environ,
            "MPJOB_LAUNCH": json.dumps(launch),
            "MPJOB_METRICS_PORT": "off",
            "MPJOB_TERMINATION_LOG": f"{tmp}/report.json",
        }
        out = subprocess.run(
            [sys.executable, "-m", "mpjob_trainer"], env=env, capture_output=True, text=True, check=False
        )
    if out.returncode != 0:
        raise RuntimeError(f"trainer {precision} exited {out.returncode}:\n{out.stderr[-3000:]}")
    events = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    steps_ev = [e for e in events if e["event"] == "step" and e.get("tokensPerSecond")][1:]  # drop warm-up window
    return {
        "tokens_per_s": statistics.median(e["tokensPerSecond"] for e in steps_ev),
        "mfu": statistics.median(e["mfu"] for e in steps_ev) if steps_ev[0].get("mfu") is not None else None,
        "peak_bytes": max((e.get("peakDeviceMemoryBytes") or 0) for e in steps_ev) or None,
    }


def baseline_run(args: dict[str, Any], precision: str, tf32: bool, batch: int, steps: int, warmup: int) -> dict:
    """nanoGPT's loop, nothing more: autocast, GradScaler for fp16, fused AdamW, clip at 1.0."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.manual_seed(0)
    task = make_task(args)
    model = task.model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    samples = [task.dataset[i] for i in range(batch)]
    x = torch.stack([a for a, _ in samples]).to(device)
    y = torch.stack([b for _, b in samples]).to(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for step in range(steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = task.loss(model(x), y)
        amp_update(loss, model, opt, scaler)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    peak = peak_flops(device)
    sps = batch / step_s
    torch.backends.cuda.matmul.allow_tf32 = False
    return {
        "tokens_per_s": sps * (task.tokens_per_sample or 0),
        "mfu": sps * task.flops_per_sample / peak if peak and task.flops_per_sample else None,
        "peak_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
    }


def fmt(row: dict) -> str:
    mfu = f"{row['mfu'] * 100:.1f}%" if row["mfu"] is not None else "n/a"
    mem = f"{row['peak_bytes'] / 2**30:.1f} GiB" if row["peak_bytes"] else "n/a"
    return f"{row['tokens_per_s']:>12,.0f} tok/s  MFU {mfu:>6}  peak {mem:>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model: a CPU smoke run of the bench itself")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    opts = parser.parse_args()
    args = TINY if opts.tiny else GPT_124M
    batch = opts.batch or (4 if opts.tiny else 8)
    steps = opts.steps or (30 if opts.tiny else 60)
    log_every = max(2, steps // 6)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    print(f"device: {device}; torch {torch.__version__}; model {args}; batch {batch}; {steps} steps")
    results: dict[str, dict[str, dict]] = {}
    for precision, tf32 in PRECISIONS:
        label = f"{precision}{' +TF32' if tf32 else ''}"
        results[label] = {
            "baseline": baseline_run(args, precision, tf32, batch, steps, warmup=log_every),
            "mpjob": trainer_run(args, precision, tf32, batch, steps, log_every),
        }
        print(f"{label:<10} baseline {fmt(results[label]['baseline'])}", flush=True)
        print(f"{label:<10} mpjob    {fmt(results[label]['mpjob'])}", flush=True)
    bf16, fp32 = results["bf16"]["mpjob"], results["fp32"]["mpjob"]
    speedup = bf16["tokens_per_s"] / fp32["tokens_per_s"]
    print(f"bf16 / strict fp32 (mpjob): {speedup:.2f}x  (target >= 6x on H100/H200)")
    if bf16["mfu"] is not None:
        print(f"bf16 MFU (mpjob): {bf16['mfu'] * 100:.1f}%  (target >= 50% on H100/H200)")
    for label, pair in results.items():
        ratio = pair["mpjob"]["tokens_per_s"] / pair["baseline"]["tokens_per_s"]
        print(f"{label:<10} mpjob / baseline: {ratio:.3f}")


if __name__ == "__main__":
    main()
