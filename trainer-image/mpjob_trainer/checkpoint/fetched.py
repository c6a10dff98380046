"""FetchedCheckpoint: a sharded checkpoint of a bucket, brought into a local folder a file at a
time as this rank's readers need it, each file checked against its manifest as it lands.

Restoring a sharded checkpoint, a rank reads DCP's index, its own rank file and its share of the
sha256 and value checks (checkpoint.shards.read_local), then what its load plan reads
(checkpoint.shards.restore_shards): the shard files that hold its tensors (on the same world size
its own, on another those its new slices overlap), and the non-tensor values (the optimizer's
param_groups, which DCP spreads over the ranks' files) by ranged reads; not the whole checkpoint
on every rank. A ranged read is checked by the rank that makes it: the rank whose share holds
the file hashes each value in it (the file checked whole against its manifest), the ranks
exchange those sha256 as they agree, and bytes of a range that differ (the object changed since)
make the checkpoint corrupt. `open_sharded` fetches what the verification reads and has the ranks agree (every
file there and right, one manifest on all ranks) before any of them goes on; DCP's reader
(checkpoint.dcp_reader.CheckedReader) asks for its plan's files through `FETCHERS` first.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from mpjob_trainer.checkpoint import document, shards
from mpjob_trainer.checkpoint.bucket import Bucket
from mpjob_trainer.checkpoint.dcp_files import FETCHERS, INDEX, Read
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, Manifest, sha256_file, share_of
from mpjob_trainer.checkpoint.peers import Peers, agree

#: Where a non-tensor value lies: (file, offset, length).
Span = tuple[str, int, int]


@dataclass
class FetchedCheckpoint:
    """The checkpoint below `prefix` of `bucket`, as far as it has been fetched into `folder`."""

    bucket: Bucket
    prefix: str
    folder: Path
    manifest: Manifest
    fetched: set[str] = field(default_factory=set)
    #: The sha256 of each non-tensor value (file, offset, length), hashed by the rank whose share
    #: checked its file: what a ranged read of it must match.
    values: dict[Span, str] = field(default_factory=dict)

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

    def for_verification(self, peers: Peers) -> dict[Span, str]:
        """What this rank's verification reads: DCP's index, its rank file and its share of the
        checks (the files, and the non-tensor values in them: checkpoint.shards.read_local);
        returns the sha256 of each value in the files of its share (`values`)."""
        share = share_of(self.manifest.files, peers.rank, peers.size)
        self.need([INDEX, shards.rank_file(peers.rank % self.manifest.world_size), *share])
        return self._value_digests(share)

    def _value_digests(self, names: list[str]) -> dict[Span, str]:
        """The sha256 of each non-tensor value DCP's index lists in the files `names` (fetched, checked)."""
        from mpjob_trainer.checkpoint.dcp_reader import read_index, value_spans

        digests: dict[Span, str] = {}
        for name, offset, length in value_spans(read_index(self.folder / INDEX, self.manifest.files), set(names)):
            with (self.folder / name).open("rb") as f:
                f.seek(offset)
                digests[(name, offset, length)] = hashlib.sha256(f.read(length)).hexdigest()
        return digests

    def reads(self, reads: list[Read]) -> None:
        """Fetch what a DCP load plan reads: a file with a tensor of the plan whole (checked), the
        non-tensor values in other files by ranged reads (the rank whose share holds the file
        checked it whole, and its values weights-only, before the ranks agreed), each checked
        against the sha256 that rank read (`values`)."""
        values: dict[str, list[tuple[int, int]]] = {}
        for name, offset, length, value in reads:
            if value:
                values.setdefault(name, []).append((offset, length))
        self.need({name for name, _, _, value in reads if not value})
        for name, spans in values.items():
            if name not in self.fetched:
                self._ranges(name, spans)

    def _ranges(self, name: str, spans: list[tuple[int, int]]) -> None:
        """The bytes `spans` of `name`, written at their offsets into a local (sparse) file, each
        the bytes the rank that checked the file read (CorruptCheckpoint when not)."""
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
                if hashlib.sha256(body).hexdigest() != self.values.get((name, offset, length)):
                    raise CorruptCheckpoint(
                        f"{self.folder.name}: {name} at {offset} is not what the rank that checked it read "
                        "(changed in the bucket since)"
                    )
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
    peers = Peers.current()
    problem, values = None, {}
    try:
        values = fetched.for_verification(peers)
    except CorruptCheckpoint as exc:
        problem = str(exc)
    seen = peers.gather((problem, manifest.state_sha256, values))
    if problem is None and len({digest for _, digest, _ in seen}) > 1:
        problem = f"{folder.name}: the ranks read different manifests (it changed while they read it)"
    agree(problem, peers)
    fetched.values = {span: digest for _, _, checked in seen for span, digest in checked.items()}
    FETCHERS[str(folder)] = fetched.reads
    return fetched


def check_sizes(bucket: Bucket, prefix: str, name: str, manifest: Manifest) -> None:
    """CorruptCheckpoint unless every file `manifest` lists is an object below `prefix` of the size
    it gives: checked from a bounded listing before anything is downloaded."""
    found = bucket.sizes(prefix, document.MAX_FILES + 1)
    for file, meta in manifest.files.items():
        if file not in found:
            raise CorruptCheckpoint(f"{name}: {file} missing from the bucket")
        if found[file] != int(meta["bytes"]):
            raise CorruptCheckpoint(f"{name}: {file} is {found[file]} bytes, its manifest says {meta['bytes']}")


def fetch_files(bucket: Bucket, prefix: str, folder: Path, manifest: Manifest) -> None:
    """Download every file `manifest` lists from below `prefix` into `folder` (its names checked on
    reading: inside it); CorruptCheckpoint when one is missing."""
    for name in manifest.files:
        target = folder / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not bucket.download(f"{prefix}/{name}", target):
            raise CorruptCheckpoint(f"{folder.name}: {name} missing from the bucket")
