"""kopf wiring, and only that: kopf watches the MixedPrecisionJobs and queues a job's key when
it is new or its spec changed; a cache watches their attempt Jobs and pods and queues a job
whose children changed; the ticker queues every job with work once per tick. The work queue
runs the level-triggered reconcile (`reconciler.py`) for each key.

The running parts are made once, at startup, from the OperatorConfig that `mpjob operator`
puts in kopf's memo, and every handler finds them there.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf

from mpjob.controller import metrics as om
from mpjob.controller.cache import ChildCache
from mpjob.controller.cluster import Cluster
from mpjob.controller.config import OperatorConfig, from_environment
from mpjob.controller.documents import allow_deep_documents
from mpjob.controller.liveness import Liveness
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob.controller.ticker import has_work, tick
from mpjob.controller.workqueue import WorkQueue
from mpjob.planning.reconcile import FINISHED
from mpjob_contract import api

log = logging.getLogger("mpjob.operator")
#: How often the startup looks whether the cache has listed everything.
SYNC_POLL_SECONDS = 0.2
#: How long a stop waits for the cache's watches, and then for the queue's workers, to end. A
#: thread of ours still running Python as the interpreter finalizes can abort the process
#: (SIGABRT: Python 3.11 ends it with pthread_exit the next time it takes the GIL, which aborts
#: in native frames or while it holds stderr's lock), so each is stopped and joined; one still in
#: a request the API server has not answered stays blocked in the socket until the process ends.
STOP_JOIN_SECONDS = 5.0


@dataclass
class Controller:
    """The running operator's parts, kept in kopf's memo as `controller`."""

    config: OperatorConfig
    cluster: Cluster
    cache: ChildCache
    queue: WorkQueue
    reconciler: Reconciler
    liveness: Liveness
    ticker: asyncio.Task[None] | None = None

    @classmethod
    def assemble(cls, config: OperatorConfig) -> Controller:
        cluster = Cluster.connect()
        cache = ChildCache(changed=lambda key: queue.add(key))  # `queue` is made below, before any watch
        peering = PeeringCheck(peering=config.peering, cluster=cluster, trust_seconds=config.peering_check_seconds)
        reconciler = Reconciler(config=config, cluster=cluster, cache=cache, peering=peering)
        queue = WorkQueue(reconciler.handle, workers=config.workers)
        liveness = Liveness(api.PLURAL, cache.dead_watches)
        return cls(
            config=config, cluster=cluster, cache=cache, queue=queue, reconciler=reconciler, liveness=liveness
        )  # fmt: skip

    def stop(self) -> None:
        """Stop every part, and join the threads that can end (STOP_JOIN_SECONDS). The metrics
        endpoint is not one: `mpjob operator` started it and stops it once kopf has returned."""
        if self.ticker is not None:
            self.ticker.cancel()
        running = self.cache.stop(STOP_JOIN_SECONDS) + self.queue.close(STOP_JOIN_SECONDS)
        self.reconciler.progress.close()
        self.reconciler.profiles.close()
        if running:
            log.info("stopped; still waiting on the API server, ending with the process: %s", ", ".join(running))


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def watched_jobs(namespace: str, name: str, status: dict[str, Any], spec: dict[str, Any], **_: Any) -> Any:
    """Every MixedPrecisionJob this operator serves, and whether the ticker still has work on it.
    An index needs no finalizer (a kopf timer would put one on every job)."""
    return {(namespace, name): has_work(status, spec)}


def finished(status: dict[str, Any], **_: Any) -> bool:
    """Whether a job has finished: kopf indexes it in `finished_jobs` only while it has (one that
    stops matching leaves the index, as a deleted one does)."""
    return (status or {}).get("phase") in FINISHED


@kopf.index(api.GROUP, api.VERSION, api.PLURAL, when=finished)
def finished_jobs(status: dict[str, Any], **_: Any) -> Any:
    """The finished MixedPrecisionJobs this operator serves, by phase (the jobs-by-phase gauge
    counts them: the reconciler holds nothing of a finished job, and reconciles none it lists)."""
    return {(status or {}).get("phase"): True}


@kopf.on.startup()
async def configure(
    settings: kopf.OperatorSettings, watched_jobs: kopf.Index, finished_jobs: kopf.Index, memo: kopf.Memo, **_: Any
) -> None:
    allow_deep_documents()  # before any watch: startup handlers run before kopf watches
    # Only warnings become Events: kopf would otherwise post one per handler run; the job's own
    # Events go through kopf.event.
    settings.posting.level = logging.WARNING
    # The probes run every few seconds: log their failures, not each success.
    logging.getLogger("kopf.activities.probe").setLevel(logging.WARNING)
    settings.watching.server_timeout = 120
    # `kopf run -m mpjob.controller.handlers` has no `mpjob operator` to make the config.
    config: OperatorConfig = memo.get("config") or from_environment(os.environ)
    controller = memo["controller"] = Controller.assemble(config)
    try:
        await started(controller, watched_jobs, finished_jobs)
    except BaseException:  # kopf runs no cleanup for a startup that failed or was cancelled, and
        # retries a failed one: the Controller it assembles then would run beside this one's threads
        memo.pop("controller", None)
        await asyncio.to_thread(controller.stop)
        raise


async def started(controller: Controller, watched_jobs: kopf.Index, finished_jobs: kopf.Index) -> None:
    """Start `controller`'s parts: its cache, listed once (`first_listing`), then its ticker
    (`watched_jobs`: which jobs it ticks; `finished_jobs`: the finished ones its gauges count)."""
    config = controller.config
    om.QUEUE_DEPTH.set_function(controller.queue.__len__)
    controller.cache.start(config.namespaces or [None], controller.cluster.batch, controller.cluster.core)
    await first_listing(controller.cache)
    reconciler = controller.reconciler
    ticks = tick(
        watched_jobs, queue=controller.queue, phases=reconciler.phases, config=config, settled=reconciler.settled,
        finished=finished_jobs,
    )  # fmt: skip
    controller.ticker = asyncio.create_task(ticks)


async def first_listing(cache: ChildCache) -> None:
    """Until every list + watch of the cache has listed once (a reconcile before that would see
    no children). Awaited, not waited on in a thread, so that a stop cancels it: kopf starts,
    and /healthz answers, only after it."""
    log.info("waiting for the first listing of attempt Jobs, pods and Events")
    while not cache.wait_synced(0):
        await asyncio.sleep(SYNC_POLL_SECONDS)


@kopf.on.probe(id="watches")
async def watches_alive(memo: kopf.Memo, **_: Any) -> str:
    """/healthz: fails (HTTP 500) while a watch is dead, kopf's or the cache's (liveness.py)."""
    controller: Controller | None = memo.get("controller")
    problems = controller.liveness.problems() if controller is not None else []
    if problems:
        raise kopf.PermanentError("; ".join(problems))
    return "alive"


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        await asyncio.to_thread(controller.stop)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def on_job_event(
    type: str | None,
    body: dict[str, Any],
    event: dict[str, Any],
    namespace: str,
    name: str,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Queue a reconcile when a job is new or its spec changed (the generation is ahead of
    status.observedGeneration), and for every unfinished job in kopf's listings (the first, and
    one each time its watch reconnects) but one settled at rest at the version listed. Each
    event's body is offered to the reconciler's bodies (the next reconcile plans from the
    newest): kept by one that queues a reconcile, else only as a newer one of a body held (a
    finished job at rest holds none: `bodies.py`). The operator's own status writes come back
    here too, and queue nothing."""
    controller: Controller = memo["controller"]
    # kopf sets the variables kopf.event needs for the processing of each object, not at
    # startup: the reconciles in the queue's threads run in a copy of this context.
    controller.reconciler.context.capture()
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    if type == "DELETED":  # children go with their owner (garbage collection); volumes stay
        controller.reconciler.forget(meta.get("uid", ""), (namespace, name))
        return
    if type is None:  # kopf's listing
        unchanged = controller.reconciler.at_rest_unchanged((namespace, name), meta.get("resourceVersion"))
        queued = has_work(status, body.get("spec")) and not unchanged
    else:
        queued = status.get("observedGeneration") != meta.get("generation")
    if isinstance(event.get("object"), dict):  # the newest body is what the next reconcile plans from
        controller.reconciler.bodies.offer((namespace, name), event["object"], only_held=not queued)
    if queued:
        controller.queue.add((namespace, name))
