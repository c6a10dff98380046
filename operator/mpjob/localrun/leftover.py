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

from datetime import datetime
from pathlib import Path

from mpjob_contract import events

#: The log of worker 0, whose stdout carries the trainer's event lines.
EVENT_LOG = "worker0.log"
KILLED = "the local run was killed and its trainers with it; run again with the same --out to resume"


def logged_events(folder: Path) -> list[events.TrainerEvent]:
    """The event lines of the attempt whose files are in `folder`, in the order they came."""
    path = folder / EVENT_LOG
    if not path.exists():
        return []
    with path.open(errors="replace") as lines:
        return [event for line in lines if (event := events.parse_line(line)) is not None]


def last_step(logged: list[events.TrainerEvent], *, start_step: int) -> int:
    """The last step the attempt logged (`start_step`: none past where it began)."""
    return max([e.step for e in logged if isinstance(e, events.Step)], default=start_step)


def seconds_seen(started: str | None, logged: list[events.TrainerEvent]) -> float:
    """Seconds from the attempt's start to its last event line (time not seen is not claimed)."""
    last = max((e.time for e in logged if e.time is not None), default=None)
    if started is None or last is None:
        return 0.0
    try:
        return max(0.0, last - datetime.fromisoformat(started).timestamp())
    except ValueError:
        return 0.0
