"""One rank of a two-rank gloo group that ends through mpjob_trainer.distributed.shutdown
(argv: rank, port, what rank 0 does: "meet" its shutdown too, or "hang" alive where it is)."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed as dist

from mpjob_trainer import distributed

rank, port, peer = int(sys.argv[1]), sys.argv[2], sys.argv[3]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
dist.init_process_group("gloo", rank=rank, world_size=2)
distributed.SHUTDOWN_MEET_SECONDS = 1
if rank == 0 and peer == "hang":
    time.sleep(600)  # alive, never at its shutdown: a data loader that stopped answering
distributed.shutdown(distributed.World(rank=rank, size=2, local_rank=0))
print(f"rank {rank} left, its group {'torn down' if not dist.is_initialized() else 'left as it was'}", flush=True)
