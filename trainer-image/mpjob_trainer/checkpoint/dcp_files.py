"""What the code around a sharded checkpoint needs of DCP's files without importing
torch.distributed.checkpoint (a second of start-up every trainer pays, most of them on a
replicated model that never writes a sharded checkpoint): the index's name."""

from __future__ import annotations

#: The name of DCP's index in a checkpoint folder.
INDEX = ".metadata"
