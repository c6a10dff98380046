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

from tests.warm import rules


def _children() -> dict[int, list[int]]:
    """Every process's children, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _forked_for(warm: Path, pid: int) -> int | None:
    """The rank a warm-start server forked for the stand-in `pid`, if it is one."""
    try:
        rank, started = rules.rank_record(str(warm), pid).read_text().split()
    except (OSError, ValueError):
        return None
    return int(rank) if started == rules.started_at(pid) else None


def processes(root: int, warm: Path) -> list[int]:
    """`root` and every process that runs for it (module doc), parents first."""
    children, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop(0)
        if pid in found:
            continue
        found.append(pid)
        todo.extend(children.get(pid, []))
        if (rank := _forked_for(warm, pid)) is not None:
            todo.append(rank)
    return found


def signal_all(pids: list[int], signum: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
