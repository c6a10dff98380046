"""One rank of a sharded save whose part fails on one rank only, run as its own process by
tests/unit/trainer/test_sharded_save_faults.py: `python sharded_save_ranks.py RANK WORLD OUT`.
The ranks meet in a gloo process group (a FileStore in OUT), save a sharded model at steps 5
and 10 into OUT/ckpt, rank 1's staging copy of the first save failing, and each writes how its
saves ended to OUT/rank<R>.json."""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.staging import DefaultStager
from torch.distributed.fsdp import fully_shard

from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.checkpoint.sharded import ShardedWriter
from mpjob_trainer.checkpoint.shards import SHARDED_OBJECTS, SHARDS, state_dicts

#: How long a save may take before the rank says it hangs.
PATIENCE = 30.0


def failing_once(stage: Any) -> Any:
    """DefaultStager.stage whose first copy fails (host memory that cannot be had)."""
    calls = []

    def stage_once(self: DefaultStager, state: Any) -> Any:
        calls.append(1)
        if len(calls) > 1:
            return stage(self, state)
        failed: Future[Any] = Future()
        failed.set_exception(RuntimeError("cannot allocate host memory for the staging copy"))
        return failed

    return stage_once


def ended(finish: Any) -> str:
    """How a save ended: 'saved step N', the error it raised, or 'hung'."""
    box: list[str] = []

    def run() -> None:
        try:
            box.append(f"saved step {finish().ref.step}")
        except Exception as exc:
            box.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PATIENCE)
    return box[0] if box else "hung"


def main() -> None:
    rank, size, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(str(out / "store"), size), rank=rank, world_size=size)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1))
    fully_shard(model)
    if rank == 1:
        DefaultStager.stage = failing_once(DefaultStager.stage)  # type: ignore[method-assign]
    store = CheckpointStore(out / "ckpt", keep=3, config_digest="d", job="ns/j/u1")
    writer, pair = ShardedWriter(store), {"module": "model"}
    outcomes = []
    for step in (5, 10):
        state = {SHARDS: state_dicts({"model": model}, pair), "step": step, SHARDED_OBJECTS: pair}
        outcome = ended(writer.start(step, "bf16", state).finish)
        outcomes.append(outcome)
        if outcome == "hung":
            break
    (out / f"rank{rank}.json").write_text(json.dumps(outcomes))
    if "hung" in outcomes:
        os._exit(0)  # a collective that never ends: no teardown would
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
