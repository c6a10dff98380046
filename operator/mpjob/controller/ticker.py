"""The ticker: every unfinished job (and every finished one whose TTL has yet to pass) is
queued for a reconcile once per tick interval, with its live progress read. It is the safety
net under the event-driven reconciles, never their replacement: ticks wait in the work queue's
second lane, behind every change.
"""

from __future__ import annotations

import asyncio
import typing
from collections import Counter
from collections.abc import Mapping
from typing import Any

import kopf

from mpjob.controller import metrics as om
from mpjob.controller.config import OperatorConfig
from mpjob.controller.workqueue import WorkQueue
from mpjob.planning.reconcile import FINISHED
from mpjob_contract import api

PHASES: tuple[str, ...] = typing.get_args(api.Phase)


def has_work(status: dict[str, Any] | None, spec: dict[str, Any] | None) -> bool:
    """Whether the ticker still has work on a job: it has not finished, or its TTL will delete
    its children."""
    ttl = ((spec or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    return (status or {}).get("phase") not in FINISHED or ttl is not None


def publish_phases(phases: Mapping[str, str]) -> None:
    """The jobs-by-phase gauge, from the phase each job's last reconcile left (by UID)."""
    counts = Counter(list(phases.values()))  # a copy: reconciles write it from other threads
    for phase in PHASES:
        om.JOBS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))


async def tick(index: kopf.Index, *, queue: WorkQueue, phases: Mapping[str, str], config: OperatorConfig) -> None:
    """Queue a tick of each job that still has work (`index`: key -> has_work) once every
    tick_seconds, spread evenly over the interval (never all at once), at most
    max_ticks_per_second. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(config.tick_seconds)
    while True:
        started = loop.time()
        due = sorted(key for key, store in list(index.items()) if any(store))
        pace = max(config.tick_seconds / max(len(due), 1), 1 / config.max_ticks_per_second)
        for key in due:
            queue.add(key, tick=True)
            await asyncio.sleep(pace)
        publish_phases(phases)
        await asyncio.sleep(max(0.0, config.tick_seconds - (loop.time() - started)))
