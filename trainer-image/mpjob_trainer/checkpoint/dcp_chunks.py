"""The chunks of a tensor in DCP's index: DCP plans a restore's reads from them alone, so a
tensor whose chunks leave part of it out keeps the run's own values there, unloaded, and says
nothing. An index is taken only when each tensor's chunks lie inside it and cover each of its
elements once (`covered`), as DCP writes them: one chunk per rank holding a piece (FSDP2 shards
along the first dimension, some ranks' pieces empty where it is short)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_metadata

#: The most chunks one tensor of an index may have.
MAX_CHUNKS = 4096


def covered(entry: Any) -> bool:
    """Whether a tensor entry's chunks (at most MAX_CHUNKS) lie inside it and cover each of its
    elements once; any other entry is not this check's."""
    if not isinstance(entry, dcp_metadata.TensorStorageMetadata):
        return True
    chunks, size = getattr(entry, "chunks", None), entry.size
    if not isinstance(chunks, list) or len(chunks) > MAX_CHUNKS:
        return False
    boxes = [_box(chunk, size) for chunk in chunks]
    inside = [box for box in boxes if box is not None]
    if len(inside) < len(boxes):
        return False
    if sum(math.prod(sizes) for _, sizes in inside) != math.prod(size):
        return False  # some element left out or read twice
    return not _overlapping(sorted(inside))


def _box(chunk: Any, size: torch.Size) -> tuple[torch.Size, torch.Size] | None:
    """A chunk's (offsets, sizes) when it is a box inside `size` (unpickled: it may hold anything)."""
    offsets, sizes = getattr(chunk, "offsets", None), getattr(chunk, "sizes", None)
    if not (isinstance(offsets, torch.Size) and isinstance(sizes, torch.Size)):
        return None
    if not len(offsets) == len(sizes) == len(size):
        return None
    spans = zip(offsets, sizes, size, strict=True)
    return (offsets, sizes) if all(o >= 0 and n >= 0 and o + n <= whole for o, n, whole in spans) else None


def _overlapping(boxes: list[tuple[torch.Size, torch.Size]]) -> bool:
    """Whether two of `boxes` (offsets, sizes), sorted by offsets, share an element: each is held
    against those still open along the first dimension (a sweep; sharded along it, one or two)."""
    open_: list[tuple[torch.Size, torch.Size]] = []
    for offsets, sizes in boxes:
        open_ = [b for b in open_ if not offsets or b[0][0] + b[1][0] > offsets[0]]
        if any(_share(offsets, sizes, *b) for b in open_):
            return True
        open_.append((offsets, sizes))
    return False


def _share(offsets: torch.Size, sizes: torch.Size, other: torch.Size, other_sizes: torch.Size) -> bool:
    """Whether two boxes share an element: they overlap along every dimension."""
    spans = zip(offsets, sizes, other, other_sizes, strict=True)
    return all(max(o, p) < min(o + n, p + m) for o, n, p, m in spans)
