"""torchrun-style process-group set-up from the environment."""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeGuard

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

#: How long the ranks wait for each other before tearing their group down (a peer gone: not long).
SHUTDOWN_MEET_SECONDS = 10


def is_dtensor(value: object) -> TypeGuard[DTensor]:
    """Whether `value` is a DTensor (FSDP2's parameters, gradients and norms), looked up where
    torch keeps it once something imported it (`fully_shard` and DCP do). A process that never
    shards never imports it: torch.distributed.tensor costs each trainer start about a second."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def world_from_env() -> World:
    """RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them; RANK falls back to the Job index."""
    rank = int(os.environ.get("RANK") or os.environ.get("JOB_COMPLETION_INDEX") or 0)
    size = int(os.environ.get("WORLD_SIZE") or 1)
    local_rank = int(os.environ.get("LOCAL_RANK") or 0)
    return World(rank=rank, size=size, local_rank=local_rank)


def pick_device(world: World) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def init_process_group(world: World, device: torch.device) -> None:
    if not world.distributed or dist.is_initialized():
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    with _stoppable_while_waiting():
        dist.init_process_group(backend=backend, rank=world.rank, world_size=world.size)


@contextlib.contextmanager
def _stoppable_while_waiting() -> Iterator[None]:
    """SIGTERM ends the process at once while it waits for its peers. The rendezvous blocks in
    C++, where no Python handler runs, so a caught SIGTERM would wait for a peer that may never
    come (the attempt shrank, the group was preempted before it formed) and the pod would hold
    its GPU until the grace period's SIGKILL. Nothing has trained yet: the launcher folds such
    a death as Preempted, and the next attempt resumes from the checkpoint this one would have."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def all_reduce_max(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """Every rank sees the largest value: so all ranks take the same guard decision."""
    if world.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def all_gather_rows(row: torch.Tensor, world: World) -> torch.Tensor:
    """Every rank's `row` (a 1-d tensor), one row per rank in rank order, in one collective: for
    figures some reduce by max and others sum (the guard's read, mpjob_trainer.guard)."""
    if not world.distributed:
        return row.unsqueeze(0)
    flat = torch.empty(world.size * row.numel(), dtype=row.dtype, device=row.device)
    dist.all_gather_into_tensor(flat, row.contiguous())  # gloo takes a flat output only
    return flat.view(world.size, row.numel())


def devices_of_every_rank(device: torch.device, world: World) -> list[str]:
    """The devices every rank trains on, distinct and sorted, as each names its own ("cuda:1",
    "cpu"), in one collective at the attempt's start: rank 0's start line names them, and
    `mpjob run` charges the GPUs of every process, not rank 0's alone (its workers share one machine)."""
    index = device.index if device.type == "cuda" and device.index is not None else -1
    rows = all_gather_rows(torch.tensor([index], dtype=torch.int64, device=device), world)
    return device_names(rows.flatten().tolist(), device.type)


def device_names(indices: list[int], kind: str) -> list[str]:
    """Every rank's CUDA device index (-1: none, a device of `kind`: the ranks share one backend)
    as distinct, sorted names."""
    return sorted({f"cuda:{k}" if k >= 0 else kind for k in indices})


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def shutdown(world: World) -> None:
    """Destroy the default process group, whoever made it: a framework may make one even for a
    world of one (accelerate does, seeing the launcher's RANK/LOCAL_RANK). One left at exit is
    torn down with its TCPStore and gloo threads still running: std::terminate (SIGABRT) after
    the report said Succeeded. The group's objects sit in reference cycles: collecting them
    here joins those threads now, while the interpreter is whole, not at some point of exit.
    On gloo the ranks first meet (`_meet`): a rank that tore its group down while a peer's last
    collective was in flight made that peer abort in gloo (SIGABRT) after both had written their
    reports. A rank the others do not meet (gone, or alive but hung where it is) leaves the group
    as it is: tearing it down would wait for that rank for good, and the process exits anyway."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_backend() == "gloo" and dist.get_world_size() > 1 and not _meet():
            return
        dist.destroy_process_group()
        gc.collect()


def _meet() -> bool:
    """Whether every rank reached its shutdown within SHUTDOWN_MEET_SECONDS. A barrier whose
    wait is bounded: monitored_barrier's is not, on a rank whose peer lives but never answers
    (a rank that crashed beside one hung in its data loader waited there for good)."""
    try:
        return dist.barrier(async_op=True).wait(timeout=timedelta(seconds=SHUTDOWN_MEET_SECONDS)) is not False
    except RuntimeError:  # the wait timed out, or a peer is gone (DistBackendError is one)
        return False
