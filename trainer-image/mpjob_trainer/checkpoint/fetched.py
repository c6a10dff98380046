"""FetchedCheckpoint: a sharded checkpoint of a bucket, brought into a local folder a file at a
time as this rank's readers need it, each file checked against its manifest as it lands.

Restoring a sharded checkpoint, a rank reads DCP's index, its own rank file and its share of the
sha256 and value checks (checkpoint.shards.read_local), then what its load plan reads
(checkpoint.shards.restore_shards): the shard files that hold its tensors (on the same world size
its own, on another those its new slices overlap), and the non-tensor values (the optimizer's
param_groups, which DCP spreads over the ranks' files) by ranged reads; not the whole checkpoint
on every rank. `open_sharded` fetches what the verification reads and has the ranks agree (every
file there and right, one manifest on all ranks) before any of them goes on; DCP's reader
(checkpoint.dcp_reader.ListedReader) asks for its plan's files through `FETCHERS` first.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpjob_trainer.checkpoint import shards
from mpjob_trainer.checkpoint.bucket import Bucket
from mpjob_trainer.checkpoint.dcp_files import FETCHERS, INDEX, Read
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest, sha256_file, share_of


@dataclass
class FetchedCheckpoint:
    """The checkpoint below `prefix` of `bucket`, as far as it has been fetched into `folder`."""

    bucket: Bucket
    prefix: str
    folder: Path
    manifest: Manifest
    fetched: set[str] = field(default_factory=set)

    def need(self, names: Iterable[str]) -> None:
        """Fetch those of `names` not here yet; CorruptCheckpoint when one is not in the manifest,
        not in the bucket, or not what the manifest says."""
        for name in sorted(set(names) - self.fetched):
            meta = self.manifest.files.get(name)
            if meta is None:
                raise CorruptCheckpoint(f"{self.folder.name}: {name[:100]} is not a file of its manifest")
            target = self.folder / name  # the manifest's names were checked: inside the folder
            target.parent.mkdir(parents=True, exist_ok=True)
            if not self.bucket.download(f"{self.prefix}/{name}", target):
                raise CorruptCheckpoint(f"{self.folder.name}: {name} missing from the bucket")
            if sha256_file(target) != meta["sha256"]:
                raise CorruptCheckpoint(f"{self.folder.name}: {name} sha256 mismatch")
            self.fetched.add(name)

    def for_verification(self, peers: shards.Peers) -> None:
        """What this rank's verification reads: DCP's index, its rank file and its share of the
        checks (the files, and the non-tensor values in them: checkpoint.shards.read_local)."""
        share = share_of(self.manifest.files, peers.rank, peers.size)
        self.need([INDEX, shards.rank_file(peers.rank % self.manifest.world_size), *share])

    def reads(self, reads: list[Read]) -> None:
        """Fetch what a DCP load plan reads: a file with a tensor of the plan whole (checked), the
        non-tensor values in other files by ranged reads (the rank whose share holds the file
        checked it whole, and its values weights-only, before the ranks agreed)."""
        values: dict[str, list[tuple[int, int]]] = {}
        for name, offset, length, value in reads:
            if value:
                values.setdefault(name, []).append((offset, length))
        self.need({name for name, _, _, value in reads if not value})
        for name, spans in values.items():
            if name not in self.fetched:
                self._ranges(name, spans)

    def _ranges(self, name: str, spans: list[tuple[int, int]]) -> None:
        """The bytes `spans` of `name`, written at their offsets into a local (sparse) file."""
        if name not in self.manifest.files:
            raise CorruptCheckpoint(f"{self.folder.name}: {name[:100]} is not a file of its manifest")
        target = self.folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for offset, length in spans:
                body = self.bucket.get_range(f"{self.prefix}/{name}", offset, length)
                if body is None or len(body) != length:
                    raise CorruptCheckpoint(f"{self.folder.name}: {name} missing or shorter in the bucket")
                os.pwrite(fd, body, offset)
        finally:
            os.close(fd)

    def forget(self) -> None:
        """Its files are no longer read: DCP's reader stops fetching for the folder."""
        FETCHERS.pop(str(self.folder), None)


def open_sharded(bucket: Bucket, prefix: str, folder: Path, manifest: Manifest) -> FetchedCheckpoint:
    """Fetch what every rank's verification of the sharded checkpoint reads, and agree: all
    ranks go on with it, or CorruptCheckpoint on all of them (a rank that went on alone would
    wait for the others forever). Later reads of the folder's shards fetch what they need."""
    fetched = FetchedCheckpoint(bucket, prefix, folder, manifest)
    peers = shards.Peers.current()
    problem = None
    try:
        fetched.for_verification(peers)
    except CorruptCheckpoint as exc:
        problem = str(exc)
    seen = peers.gather((problem, manifest.state_sha256))
    if problem is None and len({digest for _, digest in seen}) > 1:
        problem = f"{folder.name}: the ranks read different manifests (it changed while they read it)"
    shards.agree(problem, peers)
    FETCHERS[str(folder)] = fetched.reads
    return fetched
