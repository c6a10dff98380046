"""Agreement: how the ranks of an attempt come to one answer for a replay.

A replay is a short run of training steps that every rank makes together: the step
function's collectives (DDP's gradient all-reduce) pair up only when every rank runs the
same steps from the same weights. The ranks therefore agree, through the process group
training already uses, on

- where to start: rank 0's last good checkpoint (only rank 0 collects the asynchronous
  saves, so the other ranks' view of "last good" may be older; `main_says`);
- after each step, every rank's findings (`RankTable`: one row per rank, all-reduced), so
  all ranks stop at the same step with the same verdict and the same offending ranks;
- the offending step's samples, gathered from the ranks that saw it (`gathered`).

Every function here is a collective: call it on every rank, in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mpjob_trainer.distributed import World, all_reduce_max


def main_says(value: Any, world: World) -> Any:
    """Rank 0's `value` on every rank (a small picklable object)."""
    if not world.distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gathered(values: list[int], world: World) -> list[list[int]]:
    """Every rank's `values`, by rank."""
    if not world.distributed:
        return [values]
    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, values)
    return [list(v or []) for v in out]


@dataclass(frozen=True)
class RankTable:
    """Each rank's flags after one replayed step (the same table on every rank)."""

    #: rows[r][k]: flag k (in `names`' order) as rank r saw it.
    rows: list[list[bool]]
    names: tuple[str, ...]

    @classmethod
    def agree(cls, mine: dict[str, bool], world: World, device: torch.device) -> RankTable:
        """All-reduce one row per rank: one collective, whatever the world size."""
        names = tuple(mine)
        table = torch.zeros(world.size, len(names), dtype=torch.float64, device=device)
        table[world.rank] = torch.tensor([float(mine[n]) for n in names], dtype=torch.float64, device=device)
        rows = all_reduce_max(table, world).tolist()
        return cls([[v > 0 for v in row] for row in rows], names)

    def ranks(self, name: str) -> list[int]:
        """The ranks that raised flag `name`."""
        k = self.names.index(name)
        return [r for r, row in enumerate(self.rows) if row[k]]

    def any(self, *names: str) -> bool:
        return any(self.ranks(n) for n in names)


def flatten(by_rank: Sequence[Sequence[int]], ranks: Sequence[int]) -> list[int]:
    """The values of `ranks`, in rank order."""
    return [v for r in ranks for v in by_rank[r]]
