"""JSON event lines on stdout: the trainer's log, and what `mpjob run` draws its view from.

The builtin trainer and every script on the SDK (mpjob_trainer.session) write the same lines;
their schema is `mpjob_contract.events`, one model per event, which `mpjob run` parses with.
Only rank 0 writes step/checkpoint lines; every rank writes errors (`all_ranks=True`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mpjob_contract.events import format_line


class EventLog:
    def __init__(self, rank: int = 0, stream: Any = None) -> None:
        self.rank = rank
        self.stream = stream or sys.stdout
        #: Who else hears each line this rank writes (experiment tracking); they never raise.
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        #: One line at a time: the tracking thread tells its late failures itself.
        self._writing = threading.Lock()

    def __call__(self, event: str, *, all_ranks: bool = False, **fields: Any) -> None:
        if self.rank != 0 and not all_ranks:
            return
        record: dict[str, Any] = {"time": round(time.time(), 3), **fields}
        if self.rank:
            record["rank"] = self.rank
        with self._writing:
            self.stream.write(format_line(event, record) + "\n")
            self.stream.flush()
        for listener in self.listeners:
            listener(event, record)
