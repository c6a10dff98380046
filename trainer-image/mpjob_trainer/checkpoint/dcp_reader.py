"""Reading torch.distributed.checkpoint's files without running code from them.

DCP pickles its index (`.metadata`) and every non-tensor value of a state dict (an optimizer's
param_groups: lr, betas, ...), and its own reader unpickles both unrestricted: `pickle.load` in
FileSystemReader.read_metadata, `torch.load(weights_only=False)` in DefaultLoadPlanner.load_bytes.
Whoever can write the checkpoint folder can recompute its manifest, so a sha256 that matches
proves nothing about who wrote the file, and an unrestricted unpickle of it would run their code
in the trainer. Here:

- `parse_index` unpickles an index (the bytes checkpoint.shard_copies checked, never more than
  dcp_files.MAX_INDEX_BYTES of them) admitting only what DCP writes there (its metadata classes,
  `torch.Size`, dtypes, a path) and checks what it says: a Metadata whose storage entries name
  files of the checkpoint's own listing, at non-negative offsets, and whose tensors' chunks cover
  each tensor once (none left out: DCP reads only what they name); `check_values` reads each
  non-tensor value it lists weights-only. A sharded checkpoint's verification
  (checkpoint.shards.read_local) does both, so a bad index or a planted value is a corrupt
  checkpoint and the previous good one is used;
- `CheckedReader` is DCP's FileSystemReader reading only bytes checked against the manifest
  (checkpoint.shard_copies: from a volume or a bucket alike), its index with that unpickler, and
  `WeightsOnlyPlanner`
  DCP's default load planner with the values read by torch's weights-only unpickler, which tells
  objects that do not fit the index (ShardsDoNotFit: a configuration error, not damage); the
  restore (checkpoint.shards.restore_shards) loads through both, once checkpoint.dcp_fit has
  checked what the index says against the run.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from mpjob_trainer.checkpoint.dcp_chunks import covered
from mpjob_trainer.checkpoint.dcp_files import INDEX
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.shard_copies import CheckedShards

#: Where a non-tensor value lies: (file, offset, length).
Span = tuple[str, int, int]

_METADATA_CLASSES = frozenset(
    {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    }
)
#: (module, name) an index may name: DCP's own classes and the few values they hold.
_ADMITTED = {
    "torch.distributed.checkpoint.metadata": _METADATA_CLASSES,
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch": frozenset({"Size"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath"}),
    "builtins": frozenset({"set", "frozenset"}),
}


class _IndexUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _ADMITTED.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


def parse_index(raw: bytes, where: str, listed: Collection[str]) -> dcp_metadata.Metadata:
    """DCP's index from its bytes `raw`, read without running code; its storage entries must name
    files of `listed` (the checkpoint's manifest). CorruptCheckpoint, saying why, when it is not one."""
    try:
        metadata = _IndexUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:
        raise CorruptCheckpoint(f"{where}: not DCP's metadata ({str(exc)[:200]})") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(metadata.storage_data, dict):
        raise CorruptCheckpoint(f"{where}: holds a {type(metadata).__name__}, not DCP's metadata")
    if not isinstance(getattr(metadata, "storage_meta", None), dcp_metadata.StorageMeta | None):
        raise CorruptCheckpoint(f"{where}: its storage_meta is not DCP's (the reader writes into it)")
    for index, info in metadata.storage_data.items():
        if not isinstance(index, dcp_metadata.MetadataIndex) or not isinstance(index.fqn, str):
            raise CorruptCheckpoint(f"{where}: a storage entry is keyed by {str(index)[:100]!r}, not a value's index")
        name, offset, length = (getattr(info, field, None) for field in ("relative_path", "offset", "length"))
        listed_file = isinstance(name, str) and name in listed
        if not listed_file or not all(isinstance(n, int) and n >= 0 for n in (offset, length)):
            raise CorruptCheckpoint(f"{where}: a storage entry names {str(name)[:100]!r}, not a file of the checkpoint")
        if getattr(info, "transform_descriptors", None):  # mpjob writes none (no compression)
            raise CorruptCheckpoint(f"{where}: a storage entry asks for transforms mpjob never writes")
    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict) or not all(isinstance(fqn, str) for fqn in entries):
        raise CorruptCheckpoint(f"{where}: its entries are not named by strings")
    if any(map(_bad_entry, entries.values())):
        raise CorruptCheckpoint(f"{where}: an entry is neither a value nor a tensor of non-negative sizes and a dtype")
    if uncovered := next((fqn for fqn, e in entries.items() if not covered(e)), None):
        raise CorruptCheckpoint(f"{where}: the chunks of {uncovered[:100]!r} do not cover the tensor exactly once")
    return metadata


def _bad_entry(entry: Any) -> bool:
    if isinstance(entry, dcp_metadata.TensorStorageMetadata):
        dtype = getattr(getattr(entry, "properties", None), "dtype", None)
        size = getattr(entry, "size", None)  # unpickled without __init__: any field may be missing
        return not isinstance(size, torch.Size) or any(n < 0 for n in size) or not isinstance(dtype, torch.dtype)
    return not isinstance(entry, dcp_metadata.BytesStorageMetadata)


def listed_values(metadata: dcp_metadata.Metadata) -> list[tuple[Any, Any]]:
    """(index, storage info) of every non-tensor value `metadata` lists."""
    return [
        (index, info)
        for index, info in metadata.storage_data.items()
        if isinstance(metadata.state_dict_metadata.get(index.fqn), dcp_metadata.BytesStorageMetadata)
    ]


def value_spans(metadata: dcp_metadata.Metadata, within: Collection[str]) -> list[tuple[str, int, int]]:
    """(file, offset, length) of every non-tensor value `metadata` lists in the files `within`."""
    spans = [(info.relative_path, info.offset, info.length) for _, info in listed_values(metadata)]
    return [span for span in spans if span[0] in within]


def item_spans(metadata: dcp_metadata.Metadata, within: Collection[str]) -> list[Span]:
    """(file, offset, length) of every item (tensor or value) `metadata` lists in the files `within`."""
    spans = [(info.relative_path, info.offset, info.length) for info in metadata.storage_data.values()]
    return [span for span in spans if span[0] in within]


def check_values(
    where: str, metadata: dcp_metadata.Metadata, read: Callable[[str, int, int], bytes], within: Collection[str]
) -> None:
    """Every non-tensor value `metadata` lists in the files `within` reads weights-only, as the
    restore will read it (WeightsOnlyPlanner), from the bytes `read` (file, offset, length) gives:
    a planted one makes the checkpoint corrupt when it is verified."""
    for index, info in listed_values(metadata):
        if info.relative_path not in within:
            continue
        raw = read(info.relative_path, info.offset, info.length)
        try:
            torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CorruptCheckpoint(f"{where}: {index.fqn} is not a plain value ({str(exc)[:200]})") from None


class CheckedReader(FileSystemReader):
    """DCP's reader of a sharded checkpoint that reads only checked bytes (`shards`): the index
    from the bytes hashed against the manifest (read by `parse_index`), a file with a tensor of the
    copy of a file this rank checked, else by ranged reads checked against the sha256 the rank that
    checked the file took of each item (checkpoint.shard_copies)."""

    def __init__(self, shards: CheckedShards) -> None:
        super().__init__(shards.folder)
        self.shards = shards
        self.entries: dict[str, Any] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:  # DCP's fallback to a rank's own index: mpjob writes one for all
            raise CorruptCheckpoint(f"{self.shards.folder.name}: no index {INDEX} to read")
        metadata = self.shards.index()
        if metadata.storage_meta is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(
        self, metadata: dcp_metadata.Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self.entries = metadata.state_dict_metadata  # the dtype each tensor was written in (`read_metadata`'s)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(item)
        for name, items in sorted(per_file.items()):
            for item in items:
                info = self.storage_data[item.storage_index]
                raw = self.shards.read(name, info.offset, info.length)
                if item.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(item, io.BytesIO(raw))
                else:
                    _load_tensor(item, raw, planner, self.entries[item.storage_index.fqn])
            self.shards.drop(name)  # loaded: its copy's memory goes before the next file's
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _load_tensor(item: ReadItem, raw: bytes, planner: LoadPlanner, entry: Any) -> None:
    """Copy the slice `item` reads of the tensor saved in `raw` into the planner's target, as
    DCP's FileSystemReader does; CorruptCheckpoint when that tensor is of another dtype than its
    index's `entry` says (checkpoint.dtypes: copy_ would cast it) or of another size."""
    tensor = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    fqn = item.storage_index.fqn
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != entry.properties.dtype:
        held = tensor.dtype if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise CorruptCheckpoint(f"{fqn}: its shard holds {held} where its index says {entry.properties.dtype}")
    for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
        tensor = tensor.narrow(dim, offset, length)
    target = planner.resolve_tensor(item).detach()
    if target.size() != tensor.size():
        raise CorruptCheckpoint(f"{fqn}: {tuple(tensor.size())} read, {tuple(target.size())} held")
    target.copy_(tensor)
    planner.commit_tensor(item, target)


class ShardsDoNotFit(Exception):
    """This run's objects hold a key or a size the checkpoint's index does not (checked: its files
    verified): the objects are not the ones that wrote it."""


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner; a state dict's non-tensor values are read weights-only. The
    checkpoint must fit the objects as a module's strict load_state_dict wants: every key of
    theirs, of its size, and none more of the module's (`module`: its name in the state dict)."""

    def __init__(self, module: str) -> None:
        super().__init__()
        self.module = module

    def create_local_plan(self) -> LoadPlan:
        """DCP's plan; ShardsDoNotFit when this run's objects and the index differ (DCP's planning
        reads only those two: a missing key, another size; a key of the module too many)."""
        try:
            plan = super().create_local_plan()
        except (RuntimeError, ValueError) as exc:
            raise ShardsDoNotFit(str(exc)[:300]) from None
        assert self.metadata is not None  # set up by DCP before it plans
        held = (fqn for fqn in sorted(self.metadata.state_dict_metadata) if fqn.startswith(f"{self.module}."))
        extra = next((fqn for fqn in held if fqn not in self.state_dict), None)
        if extra is not None:
            raise ShardsDoNotFit(f"Unexpected key in checkpoint state_dict: {extra[:200]}")
        return plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = plain_value(read_item.dest_index.fqn, value.read())
        plain = io.BytesIO()  # our own pickle of plain values: what the default planner reads safely
        torch.save(loaded, plain)
        plain.seek(0)
        super().load_bytes(read_item, plain)


def plain_value(fqn: str, raw: bytes) -> Any:
    """The non-tensor value `fqn` from its bytes `raw`, read weights-only."""
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CorruptCheckpoint(f"{fqn}: not a plain value ({str(exc)[:200]})") from None
