"""Reading a checkpoint's file as it was checked: the bytes hashed against the manifest are the
bytes loaded, read once, so a file replaced or changed after its check is never loaded unchecked.

`read_checked` returns them (a rank file: a few kilobytes). `load_checked` torch.loads a state
(a single-file checkpoint's state.pt: as large as the model and its optimizer) from them without
a second copy: the file is hashed as it is copied, a chunk at a time, into an anonymous in-memory
file (memfd) that is then sealed (nothing can write it again) and loaded with mmap, so that the
tensors map that copy rather than being copied out of it. Peak memory is one state, as when
torch.load read the file itself (a 191 MiB state: +198 MiB; loading from one bytes buffer instead,
+384 MiB). A tensor a restore keeps as it was loaded (a CPU optimizer's state) keeps that copy.
Where there is no memfd (not Linux), the state is loaded from the bytes `read_checked` returns.
`CheckedCopy` keeps such a copy for ranged reads (a sharded checkpoint's files: checkpoint.shard_copies).

One mechanism for every store: a copy is made from a `CheckedSource`, which hands over a file's
bytes in order (`VolumeFiles`: a folder; checkpoint.bucket_files.BucketFiles: the objects below a
bucket's prefix, streamed without landing on a disk), and the sha256 is taken here, on the way
into the copy, whatever the source.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Protocol

import torch

from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, same_sha256, sized_file

_CHUNK = 1 << 20
#: The characters of a file's name a memfd is named by (its tail): a memfd's name holds at most 249
#: bytes, and a manifest may name a file of up to 1024 characters (checkpoint.document), 4 bytes each.
_MEMFD_NAME_CHARS = 60
_SEALS = getattr(fcntl, "F_SEAL_WRITE", 0) | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SHRINK", 0)


#: What a source hands a file's bytes to, a chunk at a time, in order.
Write = Callable[[bytes | memoryview], Any]


class CheckedSource(Protocol):
    """Where a checkpoint's files are read from; `folder`'s name names the checkpoint."""

    folder: Path

    def copy(self, name: str, meta: dict[str, Any], write: Write) -> None:
        """Hand the bytes of the file `name` to `write` in order, no further than one byte past
        meta's size; CorruptCheckpoint when it is missing or cannot be read."""

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        """`length` bytes of `name` at `offset`, unchecked; CorruptCheckpoint when they are not there."""
        ...


class VolumeFiles:
    """The files of the checkpoint in `folder` on a volume."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def copy(self, name: str, meta: dict[str, Any], write: Write) -> None:
        for chunk in _chunks(self.folder, name, meta):
            write(chunk)

    def read_range(self, name: str, offset: int, length: int) -> bytes:
        path = self.folder / name  # the manifest's names were checked: inside the folder
        if not path.resolve().is_relative_to(self.folder.resolve()):
            raise CorruptCheckpoint(f"{self.folder.name}: {name} is a link to a file outside the checkpoint")
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise CorruptCheckpoint(f"{self.folder.name}: cannot read {name} ({exc.strerror})") from None
        try:
            raw = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        if len(raw) != length:
            raise CorruptCheckpoint(f"{self.folder.name}: {name} is shorter than its index says")
        return raw


def read_checked(source: CheckedSource, name: str, meta: dict[str, Any]) -> bytes:
    """The file `name` of the checkpoint `source`, checked as check_files checks it, read once."""
    sink = io.BytesIO()
    _copy_checked(source, name, meta, sink.write)
    return sink.getvalue()


def load_checked(folder: Path, name: str, meta: dict[str, Any]) -> Any:
    """torch.load (weights only, onto the CPU) of the file `name` of the checkpoint in `folder`
    from the bytes checked against `meta`: CorruptCheckpoint when they differ from it or do not load."""
    copy = CheckedCopy(VolumeFiles(folder), name, meta)
    try:
        if copy.fd < 0:
            return _load(folder, name, io.BytesIO(copy.read(0, copy.size)), mmap=False)
        return _load(folder, name, f"/proc/self/fd/{copy.fd}", mmap=True)
    finally:
        copy.close()


class CheckedCopy:
    """The file `name` of the checkpoint `source` as it was checked against `meta`, read once
    into a sealed memfd mapped read-only (where there is none: the bytes); its ranges are served
    from that copy, never from the file again. Closed when dropped, if not before."""

    def __init__(self, source: CheckedSource, name: str, meta: dict[str, Any]) -> None:
        self.where, self.size, self.fd = f"{source.folder.name}: {name}", int(meta["bytes"]), -1
        if not hasattr(os, "memfd_create"):
            self.view: Any = read_checked(source, name, meta)
            self.release = weakref.finalize(self, _close, self.fd, self.view)
            return
        memfd_name = name.replace("/", "_")[-_MEMFD_NAME_CHARS:]  # only what /proc shows: any length fits
        self.fd = fd = os.memfd_create(memfd_name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            _copy_checked(source, name, meta, lambda chunk: _write_all(fd, chunk))
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            self.view = mmap.mmap(fd, self.size, prot=mmap.PROT_READ) if self.size else b""
        except BaseException:
            os.close(fd)
            raise
        self.release = weakref.finalize(self, _close, fd, self.view)

    def read(self, offset: int, length: int) -> bytes:
        """The `length` bytes at `offset` (a copy); CorruptCheckpoint when they reach past its end."""
        if offset < 0 or length < 0 or offset + length > self.size:
            raise CorruptCheckpoint(f"{self.where}: {length} bytes at {offset} reach past its {self.size}")
        return bytes(self.view[offset : offset + length])

    def close(self) -> None:
        self.release()


def _close(fd: int, view: Any) -> None:
    if isinstance(view, mmap.mmap):
        view.close()
    if fd >= 0:
        os.close(fd)


def _copy_checked(source: CheckedSource, name: str, meta: dict[str, Any], write: Write) -> None:
    """Hand the file's bytes to `write` a chunk at a time, hashing them on the way; CorruptCheckpoint
    when the file is not as `meta` says. The one place a checked copy's sha256 is taken."""
    digest = hashlib.sha256()

    def hashed(chunk: bytes | memoryview) -> None:
        digest.update(chunk)
        write(chunk)  # its failure (no memory for the copy) is no verdict on the checkpoint

    source.copy(name, meta, hashed)
    same_sha256(source.folder, name, digest.hexdigest(), meta)


def _chunks(folder: Path, name: str, meta: dict[str, Any]) -> Iterator[memoryview]:
    """The file's bytes, no further than one byte past its size; CorruptCheckpoint when it cannot be read."""
    left, buffer = int(meta["bytes"]) + 1, memoryview(bytearray(_CHUNK))
    try:
        with sized_file(folder, folder.resolve(), name, meta).open("rb", buffering=0) as f:
            while left > 0 and (n := f.readinto(buffer[: min(left, _CHUNK)])):
                yield buffer[:n]
                left -= n
    except OSError as exc:
        raise CorruptCheckpoint(f"{folder.name}: cannot read {name} ({exc.strerror})") from None


def _write_all(fd: int, chunk: bytes | memoryview) -> None:
    left = memoryview(chunk)
    while left:
        left = left[os.write(fd, left) :]


def _load(folder: Path, name: str, source: str | IO[bytes], *, mmap: bool) -> Any:
    try:
        return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as exc:
        raise CorruptCheckpoint(f"{folder.name}: cannot load {name} ({exc!r})") from exc
