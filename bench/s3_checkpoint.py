"""Checkpoints in an S3 bucket vs on a volume: save and restore wall time of a ~200 MiB
checkpoint, and the training-thread stall of a periodic save.

The workload is bench/trainer_checkpoint.py's (GPT 6x512 with AdamW: 219 MiB of fp32 masters
and optimizer state). The bucket is the test cluster's S3 server (versitygw on loopback,
started here if it is not running: tests.cluster.s3), so the figures are the store's own
costs (spool write, sha256, multipart upload, manifest commit; download and verification),
not a network's. The volume store writes to a temporary folder on the same disk.

- save: best of three synchronous `store.write` calls (what the final checkpoint costs);
- restore: best of three `resume.load(store)` calls (newest valid checkpoint: read or download,
  sha256 of every file, torch.load);
- stall: the training thread's time in `Checkpointer.save` for a periodic checkpoint, over
  `--saves` saves with a real optimizer step between them, the previous write joined outside
  the timed window (as at the default interval, where it has long finished); the background
  write's time is printed beside it to show whether it fits in the interval.

Usage: MPJOB_CLUSTER_DIR=... MPJOB_CLUSTER_PORT_BASE=... PYTHONPATH=. uv run --no-sync python bench/s3_checkpoint.py
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from bench.trainer_checkpoint import INTERVAL, Workload, sync
from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import CheckpointStore, Store, resume, snapshot
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from tests.cluster.controlplane import start_s3
from tests.cluster.layout import Layout
from tests.cluster.s3 import CREDENTIALS


def saves(store: AnyStore, work: Workload) -> tuple[float, int]:
    best, size = float("inf"), 0
    for step in range(1, 4):
        state = snapshot(work.capture(step)())
        start = time.perf_counter()
        result = store.write(step, "fp32", state)
        best, size = min(best, time.perf_counter() - start), max(size, result.bytes)
    return best, size


def restores(store: Store[Any]) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        assert resume.load(store) is not None
        best = min(best, time.perf_counter() - start)
    return best


def stalls(store: AnyStore, work: Workload, count: int) -> tuple[list[float], list[float]]:
    metrics = TrainerMetrics("bench", "bench", 0, "fp32")
    checkpoints = Checkpointer(store, World(0, 1, 0), EventLog(stream=io.StringIO()), metrics)
    held, writes = [], []
    for index in range(count):
        work.step()
        step = 100 + index
        sync(work.device)
        start = time.perf_counter()
        checkpoints.save(step, "fp32", work.capture(step), final=False)
        held.append(time.perf_counter() - start)
        done = checkpoints.collect(block=True, training_step=step)  # untimed, as at the default interval
        writes.append(done.seconds if done else float("nan"))
    return held, writes


def measure(name: str, store: AnyStore, work: Workload, count: int) -> dict[str, float]:
    save, size = saves(store, work)
    restore = restores(store)
    held, writes = stalls(store, work, count)
    figures = {
        "MiB": size / 2**20,
        "save": save,
        "restore": restore,
        "stall": statistics.median(held[1:]),
        "write": statistics.median(writes),
    }
    print(
        f"{name:7s} {figures['MiB']:.0f} MiB: save {save:.2f} s ({figures['MiB'] / save:.0f} MiB/s), "
        f"restore {restore:.2f} s, stall median {figures['stall'] * 1e3:.1f} ms "
        f"({', '.join(f'{s * 1e3:.1f}' for s in held[1:])}), background write median {figures['write']:.2f} s"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--saves", type=int, default=8, help="periodic saves timed (the first allocates)")
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    server = start_s3(Layout.from_env())
    work = Workload(torch.device("cpu"))
    work.step_seconds(2)
    step_time = work.step_seconds(3)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {os.cpu_count()} CPUs")
    print(
        f"training step {step_time * 1e3:.0f} ms; {INTERVAL} steps (default everySteps): {INTERVAL * step_time:.0f} s"
    )
    with tempfile.TemporaryDirectory() as tmp:
        volume = measure("volume", CheckpointStore(Path(tmp), keep=2, config_digest="bench"), work, args.saves)
    settings = S3Storage(bucket=server.bucket, prefix=f"bench-{uuid.uuid4().hex[:8]}", endpoint=server.endpoint)
    bucket = BucketCheckpointStore(
        f"{settings.url}/bench/s3/1", settings, keep=2, config_digest="bench", job="bench/s3/1"
    )
    s3 = measure("s3", bucket, work, args.saves)
    for figure in ("save", "restore", "stall"):
        print(f"s3 / volume {figure}: {s3[figure] / volume[figure]:.2f}x")


if __name__ == "__main__":
    main()
