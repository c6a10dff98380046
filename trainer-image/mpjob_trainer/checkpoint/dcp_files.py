"""What the code around a sharded checkpoint needs of DCP's files without importing
torch.distributed.checkpoint (a second of start-up every trainer pays, most of them on a
replicated model that never writes a sharded checkpoint): the index's name, and how large an
index a restore reads."""

from __future__ import annotations

#: The name of DCP's index in a checkpoint folder.
INDEX = ".metadata"
#: The most bytes of DCP's index a restore reads whole (a manifest may list any file up to 16 TiB,
#: and a checkpoint read from a store is not trusted). The index lists each shard of each tensor,
#: about 140 bytes a shard pickled: 256 MiB holds some 1.9 million, a 70B-parameter model's AdamW
#: state (~2,200 tensors) sharded over ~850 ranks; a save whose index is larger is refused.
MAX_INDEX_BYTES = 256 << 20


def index_size_problem(size: int) -> str | None:
    """What makes DCP's index of `size` bytes one no restore reads (None: nothing)."""
    if size <= MAX_INDEX_BYTES:
        return None
    return f"DCP's index {INDEX} of {size} bytes, over the {MAX_INDEX_BYTES} bytes a restore reads of one"
