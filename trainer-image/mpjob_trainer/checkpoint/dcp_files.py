"""What the code around a sharded checkpoint needs of DCP's files without importing
torch.distributed.checkpoint (a second of start-up every trainer pays, most of them on a
replicated model that never writes a sharded checkpoint): the index's name, a read of a plan,
and the hook that fetches a bucket's files before they are read (checkpoint.fetched)."""

from __future__ import annotations

from collections.abc import Callable

#: The name of DCP's index in a checkpoint folder.
INDEX = ".metadata"
#: A read of a plan: (file, offset, length, a non-tensor value).
Read = tuple[str, int, int, bool]
#: Folders whose files are fetched as they are read (a bucket's checkpoint: checkpoint.fetched),
#: by the folder's path: called with the reads of a plan, before they are made.
FETCHERS: dict[str, Callable[[list[Read]], None]] = {}
