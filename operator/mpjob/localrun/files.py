"""Reads of the files a run's trainers leave in its folder (a worker's termination report, a
checkpoint's manifest). Whatever runs in the trainer's processes can put anything there, so a
read takes a regular file only (never a FIFO or a device, which would hang the runner or never
end, nor a link, which may lead out of the folder) and at most a bounded number of its bytes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

#: Opened without following a final link and without waiting for a FIFO's writer.
_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def read_regular(path: Path, most: int, *, last: bool = False) -> bytes | None:
    """At most `most` bytes of the regular file `path`: its first, or with `last` its last (as
    the kubelet keeps a termination message); None when it is missing, a link or not a regular
    file."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            return None
        if last and found.st_size > most:
            file.seek(found.st_size - most)
        return file.read(most)
