"""The ticker: every unfinished job (and every finished one whose TTL has yet to delete its
children) is queued for a reconcile once per tick interval, with its live progress read. It is
the safety net under the event-driven reconciles, never their replacement: ticks wait in the
work queue's second lane, behind every change. A finished job whose children are gone is
settled (the reconciler says so): no tick does any work on it after that.
"""

from __future__ import annotations

import asyncio
import typing
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

import kopf

from mpjob.controller import metrics as om
from mpjob.controller.config import OperatorConfig
from mpjob.controller.records import Key
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


def due(index: Mapping[Key, Any], settled: Collection[Key]) -> list[Key]:
    """The jobs to tick: those the index says have work, less those the reconciler settled."""
    return sorted(key for key, store in list(index.items()) if any(store) and key not in settled)


async def tick(
    index: kopf.Index,
    *,
    queue: WorkQueue,
    phases: Mapping[str, str],
    config: OperatorConfig,
    settled: Collection[Key] = frozenset(),
) -> None:
    """Queue a tick of each job that still has work (`index`: key -> has_work; `settled`: the
    finished jobs whose children are gone) once every tick_seconds, spread evenly over the
    interval (never all at once), at most max_ticks_per_second. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(config.tick_seconds)
    while True:
        started = loop.time()
        due_now = due(index, settled)
        pace = max(config.tick_seconds / max(len(due_now), 1), 1 / config.max_ticks_per_second)
        for key in due_now:
            queue.add(key, tick=True)
            await asyncio.sleep(pace)
        publish_phases(phases)
        await asyncio.sleep(max(0.0, config.tick_seconds - (loop.time() - started)))
