"""The ticker: every unfinished job (and every finished one whose TTL has yet to delete its
children) is queued for a reconcile once per tick interval, with its live progress read. It is
the safety net under the event-driven reconciles, never their replacement: ticks wait in the
work queue's second lane, behind every change. A job at rest (`at_rest`: finished, or suspended
as its spec asks, with none of its children left) is settled (the reconciler says so): no tick
does any work on it after that; a change to it (an edit of its spec) queues its reconcile.
"""

from __future__ import annotations

import asyncio
import typing
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import kopf

from mpjob.controller import metrics as om
from mpjob.controller.config import OperatorConfig
from mpjob.controller.records import Key
from mpjob.controller.workqueue import WorkQueue
from mpjob.planning import lapse
from mpjob.planning.reconcile import FINISHED
from mpjob.planning.status import ConditionReason, ConditionType
from mpjob_contract import api
from mpjob_contract.status import MixedPrecisionJobStatus

PHASES: tuple[str, ...] = typing.get_args(api.Phase)
#: Why an attempt's pods do not start, as the PodsCreated=False condition's reason says it.
PODS_HELD: tuple[str, ...] = (
    ConditionReason.FAILED_CREATE,
    ConditionReason.CONFIG_ERROR,
    ConditionReason.IMAGE_PULL_BACKOFF,
)
#: What the jobs-in-trouble gauge counts, as `kubectl describe mpj` shows it: the next attempt
#: waits out its backoff (the Running condition's reason), the checkpoints lapsed (a condition),
#: the attempt's pods cannot be created or started (PodsCreated=False, by its reason).
TROUBLES: tuple[str, ...] = (ConditionReason.BACKING_OFF, ConditionType.CHECKPOINTS_FAILING, *PODS_HELD)


class Standing(NamedTuple):
    """What the ticker publishes of one job: its phase and the troubles its conditions show."""

    phase: str
    troubles: frozenset[str] = frozenset()


def standing(status: MixedPrecisionJobStatus) -> Standing:
    """A job's phase and troubles, from the status its last reconcile left (a finished job has
    none: its conditions tell of its end, not of a night still going on)."""
    if status.phase in FINISHED:
        return Standing(str(status.phase))
    waiting = (ConditionType.RUNNING, ConditionType.PODS_CREATED)
    held = {c.reason for c in status.conditions if c.type in waiting and c.status == "False"}
    lapsed = {ConditionType.CHECKPOINTS_FAILING} if lapse.held(status) else set()
    return Standing(str(status.phase), frozenset((held | lapsed) & set(TROUBLES)))


def has_work(status: dict[str, Any] | None, spec: dict[str, Any] | None) -> bool:
    """Whether the ticker still has work on a job: it has not finished, or its TTL will delete
    its children."""
    ttl = ((spec or {}).get("runPolicy") or {}).get("ttlSecondsAfterFinished")
    return (status or {}).get("phase") not in FINISHED or ttl is not None


def publish_phases(phases: Mapping[str, Standing], finished: Mapping[str, Collection[Any]] | None = None) -> None:
    """The jobs-by-phase and jobs-in-trouble gauges, from what each unfinished job's last
    reconcile left (by UID) and the finished jobs by phase (`finished`: kopf's index of them,
    `handlers.finished_jobs`; a finished job has no troubles)."""
    standings = [s for s in list(phases.values()) if s.phase not in FINISHED]  # a copy: reconciles write it
    counts = Counter(s.phase for s in standings)
    for phase, jobs in list((finished or {}).items()):
        counts[phase] += len(jobs)
    for phase in PHASES:
        om.JOBS_BY_PHASE.labels(phase=phase).set(counts.get(phase, 0))
    troubled = Counter(trouble for s in standings for trouble in s.troubles)
    for trouble in TROUBLES:
        om.JOBS_IN_TROUBLE.labels(condition=trouble).set(troubled.get(trouble, 0))


def at_rest(phase: str | None, *, suspend: bool, children: bool, requeue_after: float | None) -> bool:
    """Whether a job waits on nothing but a change to it (`phase`: its status's after the
    reconcile; `suspend`: its spec's runPolicy.suspend; `children`: any of its Jobs or pods left
    or deleted now; `requeue_after`: a wait its plan asked for): finished, or suspended as its
    spec asks with no wait of its own. Nothing time-driven is left to such a job."""
    if children:
        return False
    return phase in FINISHED or (phase == "Suspended" and suspend and requeue_after is None)


def due(index: Mapping[Key, Any], settled: Collection[Key]) -> list[Key]:
    """The jobs to tick: those the index says have work, less those the reconciler settled."""
    return sorted(key for key, store in list(index.items()) if any(store) and key not in settled)


async def tick(
    index: kopf.Index,
    *,
    queue: WorkQueue,
    phases: Mapping[str, Standing],
    config: OperatorConfig,
    settled: Collection[Key] = frozenset(),
    finished: Mapping[str, Collection[Any]] | None = None,
) -> None:
    """Queue a tick of each job that still has work (`index`: key -> has_work; `settled`: the
    finished jobs whose children are gone) once every tick_seconds, spread evenly over the
    interval (never all at once), at most max_ticks_per_second, and publish the phase gauges
    (`publish_phases`: `phases`, `finished`). Runs until cancelled."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(config.tick_seconds)
    while True:
        started = loop.time()
        due_now = due(index, settled)
        pace = max(config.tick_seconds / max(len(due_now), 1), 1 / config.max_ticks_per_second)
        for key in due_now:
            queue.add(key, tick=True)
            await asyncio.sleep(pace)
        publish_phases(phases, finished)
        await asyncio.sleep(max(0.0, config.tick_seconds - (loop.time() - started)))
