"""CheckedShards: a sharded checkpoint's files as one rank checked them, from its verification
to its restore, so that DCP loads only bytes hashed against the manifest, each file read once.

A file checked and then replaced or changed in its store is never loaded: what this rank reads
whole (DCP's index, its rank file, the files of its share of the checks) is hashed as it is
copied into memory (checkpoint.checked.CheckedCopy, from a volume's folder or a bucket's objects
alike: checkpoint.bucket_files), and the restore reads from that copy. A non-tensor value in a
file of another rank's share (the optimizer's param_groups, or its step, which DCP writes into
one rank's file for all) it reads by range, checked against the sha256 the rank that checked the
file took of it from its own copy (`values`, exchanged as the ranks agreed on the checkpoint), so
it reads no more of that file than its plan does; on another world size than wrote it (slices
its new shards overlap) the tensors of a share are hashed for such reads too. An item with no
such sha256 (a restore without a verification; a tensor on the same world size, which no other
rank reads) it reads from a checked copy of its whole file: its own share's tensors are never
hashed twice. A file's copy goes once its items are loaded (`drop`): a restore holds the files
of its share until it reads them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

from torch.distributed.checkpoint import metadata as dcp_metadata

from mpjob_trainer.checkpoint.checked import CheckedCopy, CheckedSource
from mpjob_trainer.checkpoint.dcp_files import INDEX, index_size_problem
from mpjob_trainer.checkpoint.dcp_reader import Span, check_values, item_spans, parse_index, value_spans
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint


class CheckedShards:
    """The files of the sharded checkpoint `source` that `files` (its manifest's) lists, read
    only as checked against it; DCP's index is read (and checked) when it is made, none of it
    when the manifest lists it larger than a restore reads (dcp_files.MAX_INDEX_BYTES)."""

    def __init__(self, source: CheckedSource, files: dict[str, dict[str, Any]]) -> None:
        self.source, self.folder, self.files = source, source.folder, files
        #: The files held as checked, by name.
        self.held: dict[str, CheckedCopy] = {}
        #: The sha256 of each item (file, offset, length), from the rank that checked its file.
        self.values: dict[Span, str] = {}
        too_big = index_size_problem(int(files.get(INDEX, {}).get("bytes", 0)))
        if too_big is not None:  # before a byte of it is read: the index is read whole
            raise CorruptCheckpoint(f"{self.folder.name}: its manifest lists {too_big}")
        index = self.whole(INDEX)
        self.index_bytes = index.read(0, index.size)
        self.drop(INDEX)
        self.index()  # checked now: a bad index makes the checkpoint corrupt when it is verified

    def index(self) -> dcp_metadata.Metadata:
        """DCP's index, read anew from its checked bytes (DCP writes into the one it is given)."""
        return parse_index(self.index_bytes, f"{self.folder.name}: {INDEX}", self.files)

    def whole(self, name: str) -> CheckedCopy:
        """The file `name`, held as checked against the manifest (read and hashed when not yet)."""
        if name not in self.held:
            meta = self.files.get(name)
            if meta is None:
                raise CorruptCheckpoint(f"{self.folder.name}: {name[:100]} is not a file of its manifest")
            self.held[name] = CheckedCopy(self.source, name, meta)
        return self.held[name]

    def contents(self, name: str) -> bytes:
        copy = self.whole(name)
        return copy.read(0, copy.size)

    def check_share(self, names: Collection[str], *, resharded: bool) -> dict[Span, str]:
        """Hold the files `names` (this rank's share of the checks) as checked, and check that
        every non-tensor value in them reads weights-only; returns the sha256 of each item in them
        another rank reads by range (what its read must match): the non-tensor values, and when
        `resharded` (read on another world size than wrote it) the tensors too. On the same world
        size a rank reads the tensors of its own share only, from the copy hashed whole."""
        share = set(names) - {INDEX}
        for name in sorted(share):
            self.whole(name)
        index = self.index()
        check_values(self.folder.name, index, self.read, within=share)
        spans = item_spans(index, share) if resharded else value_spans(index, share)
        return {span: hashlib.sha256(self.read(*span)).hexdigest() for span in spans}

    def read(self, name: str, offset: int, length: int) -> bytes:
        """The checked bytes of a range of `name`: from its copy when held; by range, checked against
        the sha256 of the rank that checked the file, when there is one; else from a copy made now."""
        span = (name, offset, length)
        if name in self.held or span not in self.values:
            return self.whole(name).read(offset, length)
        raw = self.source.read_range(name, offset, length)
        if hashlib.sha256(raw).hexdigest() != self.values[span]:
            raise CorruptCheckpoint(
                f"{self.folder.name}: {name} at {offset} is not what the rank that checked it read (changed since)"
            )
        return raw

    def drop(self, name: str) -> None:
        """Let the copy of `name` go (read again, checked, if it is needed again)."""
        copy = self.held.pop(name, None)
        if copy is not None:
            copy.close()

    def close(self) -> None:
        for name in list(self.held):
            self.drop(name)
