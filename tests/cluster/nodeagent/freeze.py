"""A machine that stops answering, as its processes see it: every process of a pod stopped
(SIGSTOP) where it stands, and continued (SIGCONT) when the machine comes back.

A pod's processes are its container's process tree (the launcher's ranks run in sessions of
their own, so its process group is not enough) and, where ranks start warm, the ranks the
warm-start servers forked for its stand-ins (tests/warm: not its descendants)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from tests.helpers import children
from tests.warm import rules


def processes(root: int, warm: Path) -> list[int]:
    """`root` and every process that runs for it (module doc), parents first."""
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop(0)
        if pid in found:
            continue
        found.append(pid)
        with contextlib.suppress(OSError):  # gone meanwhile: it has no children
            todo.extend(children(pid))
        if (rank := rules.forked_rank(str(warm), pid)) is not None:
            todo.append(rank)
    return found


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
