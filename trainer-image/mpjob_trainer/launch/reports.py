"""Where the local ranks write their termination reports: a private folder of the launcher's,
each report read back bounded. Standard library only (the start path).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: A rank's termination report is read up to this size (the contract's is 3 KiB): a rank
#: cannot make the launcher read an unbounded file.
REPORT_READ_BYTES = 16 << 10


def read_report(path: str) -> str | None:
    """A rank's report as it wrote it, at most REPORT_READ_BYTES of it; None when it wrote none."""
    try:
        with open(path, "rb") as file:
            return file.read(REPORT_READ_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None


@contextlib.contextmanager
def private_folder() -> Iterator[str]:
    """A new folder of mode 0700 under $TMPDIR for the ranks' reports, removed afterwards (what
    tempfile.TemporaryDirectory does, without its imports on the start path)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for attempt in range(100):
        path = os.path.join(base, f"mpjob-launch-{os.getpid()}-{attempt}")
        try:
            os.mkdir(path, 0o700)  # never follows a link: a name taken by anyone is skipped
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"no free name for the launcher's folder under {base}")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            for entry in os.scandir(path):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            os.rmdir(path)
