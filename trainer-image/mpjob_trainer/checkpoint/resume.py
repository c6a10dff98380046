"""Which checkpoint an attempt resumes from.

The named one (launch.resumeFrom) if it is valid, else the newest valid one; a checkpoint that
fails verification is logged (`checkpointRejected`) and the next candidate is tried, so a
corrupt or mismatched newest checkpoint falls back to the previous good one. With `newer_in`,
valid checkpoints of that precision newer than the named one come first: the attempt that was
told to resume from `prefer` wrote them itself before it was stopped (a queue preempted it, a
restarted operator recreated its Job) and restarts with the same launch; no earlier attempt in
that precision can have gone past the checkpoint it was given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint, manifest_precision, step_of

Verify = Callable[[Path], tuple[CheckpointRef, dict[str, Any]]]


def candidates(steps: list[tuple[int, Path]], prefer: str | None, *, newer_in: str | None = None) -> list[Path]:
    """The folders to try, in order, given the store's `steps` (oldest first)."""
    newest_first = list(reversed(steps))
    ordered = [path for _, path in newest_first]
    if not prefer:
        return ordered
    preferred = Path(prefer)
    rest = [path for path in ordered if path.resolve() != preferred.resolve()]
    floor = step_of(preferred.name)
    ahead = [
        path
        for step, path in newest_first
        if newer_in and floor is not None and step > floor and manifest_precision(path) == newer_in
    ]
    return ahead + [preferred] + [path for path in rest if path not in ahead]


def first_valid(
    folders: list[Path], verify: Verify, *, log: Callable[..., None]
) -> tuple[CheckpointRef, dict[str, Any]] | None:
    """The first of `folders` that verifies, with its state; None when none does."""
    for path in folders:
        try:
            return verify(path)
        except CorruptCheckpoint as exc:
            log("checkpointRejected", path=str(path), problem=str(exc))
    return None
