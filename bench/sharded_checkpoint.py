"""Checkpoint save at 4 processes: sharded (every rank writes its shards, checkpoint.sharded)
against today's rank-0 single file (DDP: rank 0 stages the whole state and writes state.pt).

Both runs are the same script on the SDK under `mpjob-launch --nproc-per-worker 4` (gloo, CPU):
a stack of `--blocks` Linear(width, width) blocks with AdamW, sharded per block and at the root
with `fully_shard`, or wrapped in DDP by `run.wrap`. Every step is padded to `--step-seconds`
so that a write has finished before the next checkpoint is due (as at the default interval of
200 steps); the first save (buffers allocated) is left out. Figures, from rank 0's event lines:
- stall: the training thread's time for one periodic checkpoint (`checkpointStaged`): waiting
  for the previous save, capturing and staging, and for the sharded path also the wait before
  the next optimizer step for the staging copy to finish;
- save wall time: from the save's start to the committed checkpoint (`checkpoint.seconds`; for
  the rank-0 path the write on its writer thread, for the sharded one staging, DCP's write,
  hashing, the agreement and the commit).

With `--stores`: the sharded save to a volume against the same to an S3 bucket (the test
cluster's S3 server: every rank uploads its own files, rank 0 commits), at 2 and 4 processes.

Usage: PYTHONPATH=. uv run --no-sync python bench/sharded_checkpoint.py [--blocks 8 --width 1024]
       MPJOB_CLUSTER_DIR=... MPJOB_CLUSTER_PORT_BASE=... PYTHONPATH=. ... bench/sharded_checkpoint.py --stores
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
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from mpjob_trainer import session as mpjob

NPROC, BATCH = 4, 4


def worker(layout: str, pause: float) -> None:
    """One rank: train and checkpoint as the job says, sharded or under DDP."""
    with mpjob.start() as run:
        blocks, width = int(run.args["blocks"]), int(run.args["width"])
        model = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(blocks)])
        if layout == "sharded":
            for block in model:
                fully_shard(block)
            fully_shard(model)
            net: nn.Module = model
        else:
            net = run.wrap(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        start = run.resume(model=model, optimizer=optimizer)
        x = torch.randn(BATCH, width)
        for step in range(start, run.total_steps):
            began = time.perf_counter()
            loss = net(x).pow(2).mean()
            run.backward(loss)
            run.step(optimizer)
            run.end_step(step + 1, loss=loss, samples=BATCH * run.world.size)
            time.sleep(max(0.0, pause - (time.perf_counter() - began)))


def launch(
    layout: str, args: argparse.Namespace, folder: Path, *, nproc: int = NPROC, s3: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """One run of `nproc` processes; its checkpoints in `folder`, or in the bucket `s3` says."""
    job = {
        "task": {"command": ["python", "bench"], "args": {"blocks": args.blocks, "width": args.width}},
        "training": {"steps": args.saves * args.every, "batchSize": BATCH, "logEvery": args.every},
        "precision": {"mode": "fp32"},
        "checkpoint": {"everySteps": args.every, "keep": 2, **({"storage": {"s3": s3}} if s3 else {})},
        "resources": {"gpusPerWorker": 0},
    }
    where = f"s3://{s3['bucket']}/{s3['prefix']}/bench/{layout}-{nproc}" if s3 else str(folder)
    launch_doc = {"jobName": f"bench-{layout}", "precision": "fp32", "checkpointDir": where, "spec": job}
    env = {
        **os.environ,
        "MPJOB_LAUNCH": json.dumps(launch_doc),
        "MPJOB_METRICS_PORT": "off",
        "MPJOB_TERMINATION_LOG": str(folder / "report.json"),
        "OMP_NUM_THREADS": "1",
        "MASTER_PORT": str(args.port),
    }
    if s3:
        from tests.cluster.s3 import CREDENTIALS

        env.update(CREDENTIALS, AWS_EC2_METADATA_DISABLED="true")
    cmd = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", str(nproc), "--workers", "1", "--"]
    cmd += [sys.executable, __file__, "--worker", layout, "--step-seconds", str(args.step_seconds)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{layout} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def stores(args: argparse.Namespace) -> dict[str, Any]:
    """The sharded save to a volume against the same to the test cluster's S3 server, at 2 and 4
    processes (the server started here if it is not running: tests.cluster.s3)."""
    import uuid

    from tests.cluster.controlplane import start_s3
    from tests.cluster.layout import Layout

    server = start_s3(Layout.from_env())
    s3 = {"bucket": server.bucket, "endpoint": server.endpoint, "prefix": f"bench-{uuid.uuid4().hex[:8]}"}
    result: dict[str, Any] = {"params": args.blocks * (args.width * args.width + args.width)}
    for nproc in (2, 4):
        runs: dict[str, Any] = {}
        for store in ("volume", "s3"):
            with tempfile.TemporaryDirectory() as tmp:
                events = launch("sharded", args, Path(tmp), nproc=nproc, s3=s3 if store == "s3" else None)
                runs[store] = figures(events, args.every)
        runs["stall_ratio"] = round(runs["s3"]["stall_ms_median"] / runs["volume"]["stall_ms_median"], 3)
        result[f"processes_{nproc}"] = runs
    return result


def figures(events: list[dict[str, Any]], every: int) -> dict[str, Any]:
    """Rank 0's stall and save time per periodic checkpoint, the first (allocating) one apart."""
    stalls = [e["stallSeconds"] for e in events if e["event"] == "checkpointStaged" and e["step"] > every]
    saves = [e["seconds"] for e in events if e["event"] == "checkpoint" and e.get("async") and e["step"] > every]
    size = max((e["bytes"] for e in events if e["event"] == "checkpoint"), default=0)
    return {
        "stall_ms_median": round(1000 * statistics.median(stalls), 2),
        "stall_ms_all": [round(1000 * s, 2) for s in stalls],
        "save_s_median": round(statistics.median(saves), 3),
        "checkpoint_mib": round(size / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", choices=["sharded", "rank0"])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--saves", type=int, default=8)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--step-seconds", type=float, default=1.5)
    parser.add_argument("--port", type=int, default=17250)
    parser.add_argument("--stores", action="store_true", help="sharded: a volume against S3, at 2 and 4 processes")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.step_seconds)
        return
    if args.stores:
        print(json.dumps(stores(args), indent=1))
        return
    result: dict[str, Any] = {"processes": NPROC, "params": args.blocks * (args.width * args.width + args.width)}
    for layout in ("rank0", "sharded"):
        with tempfile.TemporaryDirectory() as tmp:
            result[layout] = figures(launch(layout, args, Path(tmp)), args.every)
    result["stall_ratio"] = round(result["sharded"]["stall_ms_median"] / result["rank0"]["stall_ms_median"], 3)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
