"""The files of a run's folder that its trainers can reach.

Reads of what they leave there (a worker's termination report, a checkpoint's manifest, worker
0's log): whatever runs in the trainer's processes can put anything there, so a read takes a
regular file only (never a FIFO or a device, which would hang the runner or never end, nor a
link, which may lead out of the folder) and at most a bounded number of its bytes.

Writes of the runner's own files there (the workers' logs, the report and series): a link the
trainers planted at one of those names is replaced, never followed out of the folder."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO

#: Opened without following a final link and without waiting for a FIFO's writer.
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
#: Created afresh: never an entry already there (a link, a FIFO), never through a final link.
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def _regular(path: Path) -> Iterator[tuple[IO[bytes], int] | None]:
    """The regular file `path` open for reading, with its size; None when it is missing, a link
    or not a regular file."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        yield None
        return
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):  # a folder among them: a file object of one cannot be made
        os.close(fd)
        yield None
        return
    with os.fdopen(fd, "rb") as file:
        yield file, found.st_size


def read_regular(path: Path, most: int, *, last: bool = False) -> bytes | None:
    """At most `most` bytes of the regular file `path`: its first, or with `last` its last (as
    the kubelet keeps a termination message); None when it is missing, a link or not a regular
    file."""
    with _regular(path) as found:
        if found is None:
            return None
        file, size = found
        if last and size > most:
            file.seek(size - most)
        return file.read(most)


def regular_lines(path: Path, longest: int, most: int, *, first: int = 0) -> Iterator[bytes]:
    """The lines of the regular file `path` (none when it is missing, a link or not a regular
    file) among at most `most` of its bytes: all of them when it has no more, else its first
    `first` bytes and its last `most - first`, from the first line that begins in them (the lines
    between are not read). A line of more than `longest` bytes (its newline included) is passed
    over, so no more than `longest` bytes are held at a time."""
    with _regular(path) as found:
        if found is None:
            return
        file, size = found
        if size <= most:
            yield from _lines(file, longest, most)
            return
        yield from _lines(file, longest, first)
        last = most - first
        file.seek(size - last - 1)  # the byte before the last ones: is a line begun there?
        yield from _lines(file, longest, last, cut=file.read(1) != b"\n")


def _lines(file: IO[bytes], longest: int, left: int, *, cut: bool = False) -> Iterator[bytes]:
    """The lines among the next `left` bytes of `file`, a line over `longest` bytes passed over;
    with `cut`, its first piece too (the end of a line begun before them)."""
    while left > 0:
        line = file.readline(min(longest + 1, left))
        if not line:
            return
        left -= len(line)
        if len(line) <= longest and not cut:
            yield line
            continue
        cut = False
        while not line.endswith(b"\n") and left > 0:  # the rest of the line passed over
            line = file.readline(min(longest + 1, left))
            if not line:
                return
            left -= len(line)


def created(path: Path) -> int:
    """A descriptor for writing the new, empty regular file `path`, replacing whatever entry was
    there (a link is removed, not followed; FileExistsError when one comes back in between)."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return os.open(path, _CREATE, 0o644)


def write_replacing(path: Path, data: str) -> None:
    """`path` holds `data`, written whole to a fresh `.tmp` beside it and renamed over it (the
    rename replaces a link at `path` itself, never the file it leads to)."""
    tmp = path.with_suffix(".tmp")
    with os.fdopen(created(tmp), "w") as file:
        file.write(data)
    os.replace(tmp, path)
