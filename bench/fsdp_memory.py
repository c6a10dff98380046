"""FSDP2 vs DDP at 4 CPU processes: per-process memory of the training state, and steps/s.

The builtin `gpt` at 8 layers, wrapped by mpjob_trainer.sharding exactly as `run.wrap` does
(fsdp: fully_shard per block and at the root; ddp: DistributedDataParallel), AdamW, fp32.
Memory is what each process holds between steps: its parameters, their gradients and the
optimizer state (the bytes of each tensor's local storage: a DTensor's shard under fsdp). On a
CPU there is no allocator to ask for a peak; the transient all-gathered blocks of fsdp and
DDP's gradient buckets are not counted (both are per-step working memory, not the state the
issue's 16 bytes per parameter are about). Steps/s: the median of 3 timed windows of 10 steps
after 3 warm-up steps, each rank on its own micro-batch of 8 x 64 tokens.

Usage: PYTHONPATH=. python bench/fsdp_memory.py [--world 4] [--layers 8] [--width 256]
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
from collections.abc import Sized
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from mpjob_contract.parallelism import Parallelism
from mpjob_trainer import sharding
from mpjob_trainer.distributed import World
from mpjob_trainer.tasks.gpt import make_task

CPU = torch.device("cpu")


def local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    params = list({id(p): p for p in model.parameters()}.values())
    moments = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim()]
    return {
        "params": sum(local_bytes(p) for p in params),
        "grads": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(local_bytes(v) for v in moments),
    }


def rank_main(strategy: str, rank: int, world: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(0)
    task = make_task(
        {"nLayer": args.layers, "nEmbd": args.width, "nHead": 4, "blockSize": 64, "data": "random", "samples": 512}
    )
    parallelism = Parallelism(strategy=strategy)  # type: ignore[arg-type]
    net, _ = sharding.wrap(
        task.model,
        task.blocks,
        world=World(rank=rank, size=world, local_rank=rank),
        device=CPU,
        precision="fp32",
        parallelism=parallelism,
        keep_fp32=[],
    )
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-3)

    def step(i: int) -> None:
        items = [task.dataset[(i * world * 8 + rank * 8 + k) % len(cast(Sized, task.dataset))] for k in range(8)]
        x, y = torch.stack([a for a, _ in items]), torch.stack([b for _, b in items])
        task.loss(net(x), y).backward()
        sharding.clip_gradients(list(task.model.parameters()), 1.0)
        optimizer.step()

    for i in range(3):
        optimizer.zero_grad(set_to_none=True)
        step(i)
    held = state_bytes(task.model, optimizer)  # after a step: gradients and both AdamW moments exist
    windows = []
    for w in range(3):
        dist.barrier()
        began = time.perf_counter()
        for i in range(10):
            optimizer.zero_grad(set_to_none=True)
            step(100 + w * 10 + i)
        dist.barrier()
        windows.append(10 / (time.perf_counter() - began))
    return {**held, "total": sum(held.values()), "stepsPerSecond": statistics.median(windows)}


def one_rank() -> None:
    strategy, rank, world, out = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5])
    args = argparse.Namespace(**json.loads(sys.argv[6]))
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(out / f"store-{strategy}"), world), rank=rank, world_size=world
    )
    result = rank_main(strategy, rank, world, args)
    (out / f"{strategy}-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def run(strategy: str, args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    settings = json.dumps({"layers": args.layers, "width": args.width})
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", strategy, str(r), str(args.world), str(out), settings], env=env
        )
        for r in range(args.world)
    ]
    if any(p.wait() != 0 for p in procs):
        raise SystemExit(f"{strategy}: a rank failed")
    return [json.loads((out / f"{strategy}-{r}.json").read_text()) for r in range(args.world)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = {s: run(s, args, Path(tmp)) for s in ("ddp", "fsdp")}
    mib = 2**20
    print(f"gpt {args.layers} layers x {args.width} wide, {args.world} CPU processes (gloo), fp32, AdamW")
    print("| what | ddp | fsdp | fsdp / ddp |")
    print("|---|---|---|---|")
    for key in ("params", "grads", "optimizer", "total"):
        ddp, fsdp = max(r[key] for r in results["ddp"]), max(r[key] for r in results["fsdp"])
        print(f"| {key} per process (largest rank) | {ddp / mib:.2f} MiB | {fsdp / mib:.2f} MiB | {fsdp / ddp:.3f} |")
    ddp_s, fsdp_s = (statistics.median(r["stepsPerSecond"] for r in results[s]) for s in ("ddp", "fsdp"))
    print(f"| steps/s | {ddp_s:.2f} | {fsdp_s:.2f} | {fsdp_s / ddp_s:.3f} |")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        one_rank()
    else:
        main()
