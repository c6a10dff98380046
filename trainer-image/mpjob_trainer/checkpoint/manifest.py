"""The on-disk format of one checkpoint: its file names, its manifest, and how files are hashed
and made durable.

A checkpoint is a folder:
    state.pt        torch.save of the whole training state (weights_only-safe)
    framework/      what a framework adapter wrote (Hugging Face Trainer, Lightning), if any
    manifest.json   written last: formatVersion, step, precision, configDigest, job (the
                    `<namespace>/<name>/<uid>` that wrote it), createdAt and `files`, the
                    sha256 and size of every other file in the folder (bucket: `writer`, checkpoint.objects);
                    on a cluster `attempt` and `attemptJob`, the attempt and the UID of the Job
                    that wrote it (checkpoint.lineage: a stray attempt's are not resumed from)

Format versions (`formatVersion`; a manifest without the field is version 1):
    1  the layout above, and the builtin loop's AdamW had ONE parameter group
    2  the same layout; the builtin loop's AdamW has two groups (decay / no decay, see
       speed.decay_groups). Loading a version-1 checkpoint re-splits its optimizer state by
       parameter (checkpoint.migrate); the store reads 1..FORMAT_VERSION and rejects newer ones.
Layouts (`layout`, absent: `single`; `worldSize`: how many processes wrote it), of format 2:
    single  state.pt as above (any run whose model is not sharded)
    dcp     written under a sharded model (checkpoint.shards): no state.pt; every rank's shards
            as torch.distributed.checkpoint wrote them (`.metadata`, `__<rank>_<n>.distcp`) and
            `rank-<r>.pt` per rank (its generators and the small state, torch.save). A trainer
            from before layouts finds no state.pt in the manifest and refuses it, never misreads.
Bump FORMAT_VERSION whenever what a checkpoint holds changes in a way an older reader would
misread, and teach checkpoint.migrate to bring the previous version forward.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mpjob_trainer.checkpoint import document
from mpjob_trainer.errors import ConfigError

STATE = "state.pt"
MANIFEST = "manifest.json"
#: Where an adopted framework checkpoint lies inside an mpjob checkpoint directory.
FRAMEWORK = "framework"
#: The format this trainer writes; it reads every version from 1 up to this one.
FORMAT_VERSION = 2
#: Layouts: one state.pt (any run without a sharded model), or torch.distributed.checkpoint shards.
SINGLE, DCP = "single", "dcp"
#: What a manifest without `formatVersion` is: written before the field existed.
UNVERSIONED = 1
#: ASCII digits only, the whole name: `\d` takes any script's digits and `$` a trailing newline, and
#: names that parse to one step and differ (a bucket's listing, a folder) would be two checkpoints.
_FOLDER = re.compile(r"step-([0-9]{9})")
#: A file one rank of a sharded checkpoint wrote for itself: its DCP shards, its rank file.
_RANKS_OWN = re.compile(r"^(?:__(\d+)_\d+\.distcp|rank-(\d+)\.pt)$")


class CorruptCheckpoint(Exception):
    """A checkpoint that must not be resumed from (damaged, from another job, or unreadable)."""


class PartlyLoaded(CorruptCheckpoint):
    """A checkpoint rejected once its loading into the run's objects had begun: part of it may be there."""


@dataclass(frozen=True)
class Manifest:
    step: int
    precision: str
    config_digest: str | None
    format_version: int
    #: relative path -> {"sha256": ..., "bytes": ...}
    files: dict[str, dict[str, Any]]
    #: The job that wrote it (AttemptLaunch.job_identity): what a store may prune or move aside.
    job: str = ""
    #: SINGLE or DCP; and how many processes wrote it (a sharded checkpoint has one file per rank).
    layout: str = SINGLE
    world_size: int = 1
    writer: str | None = None  # a bucket's: the folder below the step's prefix of `files` (checkpoint.objects)
    #: The attempt and the Job (its UID) that wrote it, when it ran in one (checkpoint.lineage).
    attempt: int | None = None
    attempt_job: str | None = None

    @property
    def state_sha256(self) -> str:
        """What names the state: state.pt's sha256, or for shards a digest of every file's."""
        if self.layout == SINGLE:
            return str(self.files[STATE]["sha256"])
        listing = json.dumps({name: meta["sha256"] for name, meta in self.files.items()}, sort_keys=True)
        return hashlib.sha256(listing.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {
            "formatVersion": self.format_version,
            "step": self.step,
            "precision": self.precision,
            "configDigest": self.config_digest,
            "job": self.job,
            "layout": self.layout,
            "worldSize": self.world_size,
            "files": self.files,
            "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **({"writer": self.writer} if self.writer else {}),
            **({"attempt": self.attempt, "attemptJob": self.attempt_job} if self.attempt_job else {}),
        }


def folder_name(step: int) -> str:
    """The name of `step`'s checkpoint folder."""
    return f"step-{step:09d}"


def step_of(name: str) -> int | None:
    """The step a checkpoint folder's name holds; None for any other name."""
    m = _FOLDER.fullmatch(name)
    return int(m.group(1)) if m else None


def read_manifest(folder: Path) -> Manifest:
    """The manifest of the checkpoint in `folder`; CorruptCheckpoint when missing, unreadable,
    malformed (checkpoint.document), or of a format this trainer cannot read."""
    path = folder / MANIFEST
    try:
        if not path.is_file():
            raise CorruptCheckpoint(f"{folder.name}: manifest missing")
        with path.open("rb") as f:
            raw = f.read(document.MAX_MANIFEST_BYTES + 1)
    except OSError as exc:  # a folder or file this process may not read: not a checkpoint it can use
        raise CorruptCheckpoint(f"{folder.name}: cannot read {MANIFEST} ({exc.strerror})") from None
    return parse_manifest(raw, folder.name)


def parse_manifest(raw: bytes, name: str) -> Manifest:
    """The manifest `raw` of the checkpoint folder `name`; CorruptCheckpoint as read_manifest."""
    try:
        doc = document.parse(raw)
    except document.Malformed as exc:
        raise CorruptCheckpoint(f"{name}: unreadable manifest ({exc})") from None
    if not UNVERSIONED <= doc.format_version <= FORMAT_VERSION:
        raise CorruptCheckpoint(
            f"{name}: checkpoint format {doc.format_version}, this trainer reads formats "
            f"{UNVERSIONED} to {FORMAT_VERSION}: resume it with a trainer image at least as new as the one "
            "that wrote it"
        )
    if doc.layout not in (SINGLE, DCP):
        raise CorruptCheckpoint(
            f"{name}: manifest says layout {doc.layout!r}, world size {doc.world_size}: "
            f"this trainer reads layouts {SINGLE} and {DCP}"
        )
    if MANIFEST in doc.files or (doc.layout == SINGLE and STATE not in doc.files):
        raise CorruptCheckpoint(f"{name}: manifest lists itself, or a single-file checkpoint without {STATE}")
    files = {file: entry.model_dump() for file, entry in doc.files.items()}
    fields = (doc.step, doc.precision, doc.config_digest, doc.format_version, files, doc.job, doc.layout)
    return Manifest(*fields, doc.world_size, doc.writer, doc.attempt, doc.attempt_job)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write the manifest durably: it is the last file of a checkpoint, what makes it one."""
    with (folder / MANIFEST).open("w") as f:
        json.dump(manifest.to_json(), f)
        f.flush()
        os.fsync(f.fileno())


def check_files(folder: Path, manifest: Manifest, share: tuple[int, int] = (0, 1)) -> None:
    """Every file the manifest lists is there, inside `folder` (not a link out of it), with its
    size and sha256 (state.pt and any framework files, or every rank's shards). `share` (rank,
    ranks): check only this rank's share (`share_of`), when the ranks split the reading of a
    sharded checkpoint between them."""
    inside = folder.resolve()
    for name in share_of(manifest.files, *share):
        try:
            _check_file(folder, inside, name, manifest.files[name])
        except OSError as exc:  # a file this process may not read, or one that fails to be read
            raise CorruptCheckpoint(f"{folder.name}: cannot read {name} ({exc.strerror})") from None


def _check_file(folder: Path, inside: Path, name: str, meta: dict[str, Any]) -> None:
    """The file `name` of the checkpoint in `folder` (resolved: `inside`) is as `meta` says."""
    same_sha256(folder, name, sha256_file(sized_file(folder, inside, name, meta)), meta)


def sized_file(folder: Path, inside: Path, name: str, meta: dict[str, Any]) -> Path:
    """The file `name`, there, inside the checkpoint and of the size `meta` gives."""
    path = folder / name
    if not path.is_file():
        raise CorruptCheckpoint(f"{folder.name}: {name} missing")
    if not path.resolve().is_relative_to(inside):  # a link: the name stays inside, the file does not
        raise CorruptCheckpoint(f"{folder.name}: {name} is a link to a file outside the checkpoint")
    size = path.stat().st_size
    if size != meta["bytes"]:  # before hashing: a planted file of any size is not read through
        raise CorruptCheckpoint(f"{folder.name}: {name} is {size} bytes, its manifest says {meta['bytes']}")
    return path


def same_sha256(folder: Path, name: str, actual: str, meta: dict[str, Any]) -> None:
    if actual != (expected := str(meta.get("sha256"))):
        raise CorruptCheckpoint(f"{folder.name}: {name} sha256 mismatch ({actual[:12]} != {expected[:12]})")


def state_problem(state: Any, step: int) -> str | None:
    """What makes a loaded state.pt or rank file no state of the manifest's `step` (None: nothing):
    a weights-only pickle may hold any plain value, so it must be a dict whose `step` is that integer."""
    if not isinstance(state, dict):
        return f"holds a {type(state).__name__}, not a training state of the manifest's step {step}"
    found = state.get("step")
    if type(found) is not int or found != step:
        return f"holds step {repr(found)[:40]}, not the manifest's step {step}"
    return None


#: Why a state with a value torch's weights-only unpickler refuses is not written, and what to do.
_UNREADABLE = (
    "which a restore cannot read back (torch.load(weights_only=True) admits tensors, Python numbers, "
    "strings, bytes, None and lists, tuples, sets and dicts of them): make state_dict() return plain values"
)
#: Values the weights-only unpickler reads back, known without pickling them (exact types).
_PLAIN = frozenset({str, bytes, int, float, bool, complex, type(None), torch.Size, torch.dtype, torch.device})


def check_loadable(state: dict[str, Any], step: int) -> None:
    """A ConfigError naming the value when a restore could not read `state` (step `step`'s) back."""
    unreadable = unreadable_value(state)
    if unreadable is not None:
        raise ConfigError(f"the checkpoint of step {step} holds {unreadable}, {_UNREADABLE}")


def unreadable_value(value: Any, place: str = "") -> str | None:
    """Where in `value` (a state to torch.save) lies one that torch.load(weights_only=True), the
    restore's reader, refuses, and its type (None: nowhere). Plain values and containers are
    judged by their type, anything else by a weights-only reading of its own pickle."""
    if isinstance(value, torch.Tensor) or type(value) in _PLAIN:
        return None
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            found = unreadable_value(key, place) or unreadable_value(item, f"{place}.{key}" if place else str(key))
            if found is not None:
                return found
        return None
    if type(value) in (list, tuple, set, frozenset):
        return next((found for i, item in enumerate(value) if (found := unreadable_value(item, f"{place}[{i}]"))), None)
    pickled = io.BytesIO()
    torch.save(value, pickled)
    pickled.seek(0)
    try:
        torch.load(pickled, weights_only=True)
    except Exception:
        return f"{place or 'the state'}, a {type(value).__module__}.{type(value).__qualname__}"
    return None


def share_of(names: Iterable[str], rank: int, ranks: int) -> list[str]:
    """The files rank `rank` of `ranks` checks: a writer's own files go to its rank (mod `ranks`:
    on the same world size a rank checks what it reads anyway), the others round robin."""
    others = [name for name in sorted(names) if not _RANKS_OWN.match(name)]
    own = [name for name in sorted(names) if (m := _RANKS_OWN.match(name)) and int(m[1] or m[2]) % ranks == rank]
    return own + others[rank::ranks]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(root: Path) -> dict[str, dict[str, Any]]:
    """sha256 and size of every file under `root` but the manifest, each fsynced on the way
    (a framework's own writes are not known to be durable)."""
    files = hash_files(root, [p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST])
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(folder)
    return files


def hash_files(root: Path, paths: list[Path]) -> dict[str, dict[str, Any]]:
    """sha256 and size of each of `paths` (files under `root`, named relative to it), fsynced."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(paths):
        with path.open("rb") as f:
            os.fsync(f.fileno())
        files[path.relative_to(root).as_posix()] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return files


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
