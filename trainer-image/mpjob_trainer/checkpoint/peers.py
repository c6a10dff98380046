"""The ranks that read or write one checkpoint together, and how they agree on it.

Every rank reaches each agreement with its own verdict: a problem with the checkpoint found on
any rank rejects it on all of them (CorruptCheckpoint), and a rank whose check failed without a
verdict (an I/O or bucket error) raises its error while the others raise PeerFailed naming it, or
the same ConfigError when it was one (a checkpoint that does not fit the run on one rank fits it on
none: the attempt ends alike on every rank); none of them is left waiting alone in a collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Peers:
    """The ranks that write or read one checkpoint together, and the group they talk on."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None

    @classmethod
    def current(cls, group: dist.ProcessGroup | None = None) -> Peers:
        if not (dist.is_available() and dist.is_initialized()):
            return cls(0, 1)
        return cls(dist.get_rank(), dist.get_world_size(), group)

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def from_main(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if self.size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]


def all_ranks(verdict: torch.Tensor) -> torch.Tensor:
    """A boolean tensor true on every rank only when it is true on all of them."""
    if dist.is_available() and dist.is_initialized():
        flag = verdict.to(torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag.bool()
    return verdict


class PeerFailed(Exception):
    """Another rank failed (an I/O or bucket error, no verdict on the checkpoint) while the ranks
    read one together: this one stops too (InfraError) rather than wait alone in a collective."""


def agree(problem: str | None, peers: Peers, failure: Exception | None = None) -> None:
    """Raise CorruptCheckpoint on every rank when any rank found a `problem`; a rank's `failure`
    is raised on it, and on the others PeerFailed (the same ConfigError when it was one), before
    any verdict."""
    error = None if failure is None else (f"{type(failure).__name__}: {failure}", isinstance(failure, ConfigError))
    said = peers.gather((problem, error))
    if failure is not None:
        raise failure
    if failed := [(rank, error) for rank, (_, error) in enumerate(said) if error is not None]:
        rank, (message, config) = failed[0]
        if config:
            raise ConfigError(f"rank {rank}: {message.removeprefix('ConfigError: ')}")
        raise PeerFailed(f"rank {rank} failed while the ranks read a checkpoint together: {message}")
    found = [(rank, p) for rank, (p, _) in enumerate(said) if p is not None]
    if found:
        rank, first = found[0]
        raise CorruptCheckpoint(first if rank == peers.rank else f"rank {rank}: {first}")


def agreed(check: Callable[[], T], peers: Peers, found: str | None = None) -> T:
    """`check()`'s answer, once every rank of `peers` has checked: CorruptCheckpoint on all when it
    raised one on any (or a rank `found` a problem before); another exception on its rank and
    PeerFailed on the others (a rank that raised alone would leave them waiting in a collective)."""
    answer, problem, failure = None, found, None
    if problem is None:
        try:
            answer = check()
        except CorruptCheckpoint as exc:
            problem = str(exc)
        except Exception as exc:
            failure = exc
    agree(problem, peers, failure)
    return cast(T, answer)
