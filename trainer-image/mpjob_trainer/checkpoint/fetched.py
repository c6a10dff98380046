"""FetchedCheckpoint: a sharded checkpoint of a bucket, brought into a local folder a file at a
time as this rank's readers need it, each file checked against its manifest as it lands.

Restoring a sharded checkpoint, a rank reads DCP's index, its own rank file, its share of the
sha256 checks and the files that hold the state's non-tensor values (checkpoint.shards.read_local),
then the shard files its load plan reads (checkpoint.shards.restore_shards): on the same world
size its own shards, on another the shards its new slices overlap; not the whole checkpoint on
every rank. `open_sharded` fetches what the verification reads and has the ranks agree (every
file there and right, one manifest on all ranks) before any of them goes on; DCP's reader
(checkpoint.dcp_reader.ListedReader) asks for its plan's files through `FETCHERS` first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpjob_trainer.checkpoint import shards
from mpjob_trainer.checkpoint.bucket import Bucket
from mpjob_trainer.checkpoint.dcp_reader import FETCHERS, INDEX, read_index, value_files
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
        """What this rank's verification reads: DCP's index, its rank file, its share of the checks
        and the files holding non-tensor values."""
        share = share_of(self.manifest.files, peers.rank, peers.size)
        self.need([INDEX, shards.rank_file(peers.rank % self.manifest.world_size), *share])
        self.need(value_files(read_index(self.folder / INDEX, self.manifest.files)))

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
    FETCHERS[str(folder)] = fetched.need
    return fetched
