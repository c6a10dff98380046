"""What a killed `mpjob run` left of the attempt it was running.

The runner copies worker 0's event lines into the attempt's `worker0.log` as they come
(line-buffered), and its workers die with it (`workers.die_with`). So a runner killed without
a word (SIGKILL, a closed terminal, the kernel's OOM killer) leaves the lines that say where the
attempt really began, the steps it trained and the checkpoints it committed. The rerun of the
same --out replays them through the path live lines take (the status through
`planning/observe.py`, the series) and ends the attempt as Ctrl-C ends one: the user's stop,
Suspended and uncharged (`planning/charging.py`), as runPolicy.suspend on a cluster.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import datetime
from functools import reduce
from pathlib import Path

from pydantic import ValidationError

from mpjob.localrun.files import read_regular, regular_lines
from mpjob.localrun.readings import reached
from mpjob_contract import events

#: The log of worker 0, whose stdout carries the trainer's event lines.
EVENT_LOG = "worker0.log"
KILLED = "the local run was killed and its trainers with it; run again with the same --out to resume"
#: The message of an attempt the runner was killed before starting (while it waited to retry a failure).
KILLED_UNSTARTED = "the local run was killed before this attempt started; run again with the same --out to resume"
#: The most of a manifest read (a single-file checkpoint's is a few hundred bytes).
MAX_MANIFEST_BYTES = 64 * 1024
#: The longest line replayed as an event; a longer one is passed over as a plain log line (what
#: is read of the log is held a line at a time, so this bounds the memory a read takes).
MAX_EVENT_LINE_BYTES = 1024 * 1024
#: The most of worker 0's log replayed: of a longer one, its first MAX_LOG_HEAD_BYTES (where the
#: attempt began) and its newest lines (where it got to); the lines between are not read.
MAX_LOG_BYTES = 64 * 1024 * 1024
MAX_LOG_HEAD_BYTES = 1024 * 1024


def logged_events(folder: Path) -> list[events.TrainerEvent]:
    """The event lines of the attempt whose files are in `folder`, in the order they came: of its
    log only a regular file (a FIFO would hang the rerun, a link may lead anywhere), read a
    bounded line at a time within MAX_LOG_BYTES, its start and its newest lines (a change of
    precision in place logged between them is not seen)."""
    lines = regular_lines(folder / EVENT_LOG, MAX_EVENT_LINE_BYTES, MAX_LOG_BYTES, first=MAX_LOG_HEAD_BYTES)
    return [event for line in lines if (event := events.parse_line(line.decode(errors="replace"))) is not None]


def started(folder: Path) -> bool:
    """Whether the attempt whose files are in `folder` started its workers: worker 0's log, which
    they are started with, is there (a runner killed before, in the wait that retries a failure, left none)."""
    return os.path.lexists(folder / EVENT_LOG)


def attributed(
    logged: list[events.TrainerEvent], index: int, precision: str
) -> Iterator[tuple[int, str, events.TrainerEvent]]:
    """Each line with the attempt it belongs to: a log begins with attempt `index` in
    `precision`, and every `precisionChanged` line (its own included) begins the attempt it names."""
    for event in logged:
        if isinstance(event, events.PrecisionChanged):
            index, precision = event.attempt, event.to_precision
        yield index, precision, event


def reached_step(logged: list[events.TrainerEvent]) -> int | None:
    """The step the attempt's lines put it at (`readings.reached`); None when none names one."""
    return reduce(reached, logged, None)


def seconds_seen(started: str | None, logged: list[events.TrainerEvent]) -> float:
    """Seconds from the attempt's start to its last event line (time not seen is not claimed)."""
    last = max((e.time for e in logged if e.time is not None), default=None)
    if started is None or last is None:
        return 0.0
    try:
        return max(0.0, last - datetime.fromisoformat(started).timestamp())
    except ValueError:
        return 0.0


def committed_after(checkpoints: Path, step: int) -> events.Checkpoint | None:
    """The newest single-file checkpoint committed after `step` (its manifest written, which the
    trainer does last), as the checkpoint line the runner may not have copied before it was
    killed; None when there is none (a sharded layout is left to its logged lines)."""
    folders = sorted(checkpoints.glob("step-*/manifest.json"), reverse=True)
    for manifest in folders:
        found = _checkpoint_line(manifest)
        if found is not None and found.step > step:
            return found
        if found is not None:
            return None
    return None


def _checkpoint_line(manifest: Path) -> events.Checkpoint | None:
    """The checkpoint line a manifest stands for; None unless it is a regular file (not a FIFO,
    which would hang the rerun, nor a link) in a real step folder (not a link out of the store)
    that reads back, whole, as a single-file checkpoint's manifest of its folder's step."""
    if manifest.parent.is_symlink():
        return None
    raw = read_regular(manifest, MAX_MANIFEST_BYTES + 1)
    if raw is None or len(raw) > MAX_MANIFEST_BYTES:
        return None
    try:
        doc = json.loads(raw)
        state = doc["files"]["state.pt"]
        line = {"step": doc["step"], "path": str(manifest.parent), "sha256": state["sha256"], "bytes": state["bytes"]}
        found = events.Checkpoint.model_validate({**line, "seconds": 0.0, "async": False})
    except (ValueError, KeyError, TypeError, ValidationError):
        return None
    return found if manifest.parent.name == f"step-{found.step:09d}" else None
