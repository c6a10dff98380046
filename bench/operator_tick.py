"""The operator's cost per job of one tick, against the number of jobs it holds: whether
a reconcile of one job does work in proportion to all of them (O(n) per job, O(n^2) a tick).

No cluster: the operator's own Reconciler, ChildCache and RoomReader over a harness API
server in memory (`Api`: the jobs' bodies, status patches, creates; the Nodes and the GPU
pods of every namespace). N MixedPrecisionJobs, each made by a first reconcile (its attempt
Job created and put in the cache as the operator puts it) and then given 2 running pods by
the cache's watch entry (`ChildCache.apply`, as a watch event). Timed: one tick of steady
reconciles of all N (nothing to change: no write), and the room an elastic job below its
workers reads (`capacity.fits_now`, one shared read of every GPU pod) for all N. Per job, in
CPU time of the timing thread (`time.thread_time`: the machine is shared) and wall time,
best of `--repeats`. Then N finished jobs as a restarted operator meets them (kopf's listing,
`handlers.on_job_event`, and one reconcile each): the bodies it holds after and the memory it
holds in all (tracemalloc, the harness's own copies left out); and the removal of one
FailedCreate Event with N held (`Children.drop`).

Usage: PYTHONPATH=operator:contract:trainer-image:. python bench/operator_tick.py 100 1000 3000
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, cast

import kopf

from mpjob.controller import capacity
from mpjob.controller.cache import ChildCache
from mpjob.controller.children import Children
from mpjob.controller.config import OperatorConfig
from mpjob.controller.create_failures import CreateFailure
from mpjob.controller.handlers import Controller, on_job_event
from mpjob.controller.liveness import Liveness
from mpjob.controller.ownership import ObjectRef
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob.controller.workqueue import WorkQueue
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

NS, NODES, GPUS_PER_NODE = "team", 64, 8
SPEC = {"workers": 2, "task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 1, "minComputeCapability": "8.0"}}
ELASTIC = {**SPEC, "workers": 4, "elastic": {"minWorkers": 1, "waitSeconds": 60}}
BELOW = {"phase": "Running", "attempt": 0, "attempts": [{"index": 0, "precision": "fp16", "worldSize": 2}]}
ENDED = {"index": 0, "precision": "fp16", "startTime": "2026-01-01T00:00:00Z", "finishTime": "2026-01-01T01:00:00Z",
         "reason": "Succeeded", "jobUid": "job-x"}  # fmt: skip
FINISHED = {"phase": "Succeeded", "attempt": 0, "attempts": [ENDED], "observedGeneration": 1}


class Api:
    """The API server as the reconciler and the room reader see it: N jobs' bodies, status
    patches at a resourceVersion, creates that answer as the server does; Nodes and pods."""

    def __init__(self) -> None:
        self.bodies: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.patches = 0
        self.core = self

    def add(self, name: str) -> dict[str, Any]:
        meta = {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1, "resourceVersion": "1"}
        body = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": meta, "spec": SPEC}
        self.bodies[(NS, name)] = body
        return copy.deepcopy(body)

    def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.bodies[(namespace, name)])

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        self.patches += 1
        body = self.bodies[(namespace, name)]
        assert resource_version in (None, body["metadata"]["resourceVersion"]), "a write from an old read"
        merged = {**(body.get("status") or {}), **status}
        body["status"] = {k: v for k, v in merged.items() if v is not None}
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(body)

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        kopf.adopt(job, owner=owner)  # type: ignore[arg-type]  # as Cluster.create_job
        return {**job, "metadata": {**job["metadata"], "uid": f"job-{job['metadata']['name']}"}}

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        pass

    def create_secret(self, secret: dict[str, Any], *, owner: dict[str, Any]) -> None:
        pass

    def gpu_room(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        return [node(i) for i in range(NODES)], self.pods

    def list_node(self, **kwargs: Any) -> dict[str, Any]:
        return {"items": [node(i) for i in range(NODES)]}


def node(i: int) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}
    status = {
        "allocatable": {"nvidia.com/gpu": str(GPUS_PER_NODE)},
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    return {"metadata": {"name": f"n{i}", "labels": labels}, "spec": {}, "status": status}


def pod(name: str, rank: int, at: int) -> dict[str, Any]:
    """Rank `rank` of attempt 0 of job `name`, running on node `at`, as the watch delivers it."""
    job = f"{name}-a0"
    meta = {
        "name": f"{job}-{rank}-x", "namespace": NS, "uid": f"pod-{job}-{rank}",
        "labels": {"mpjob.dev/job": name, "mpjob.dev/attempt": "0"},
        "annotations": {"batch.kubernetes.io/job-completion-index": str(rank)},
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": f"job-{job}", "controller": True}
        ],
    }  # fmt: skip
    resources = {"requests": {"nvidia.com/gpu": "1"}}
    trainer = [{"name": "trainer", "state": {"running": {}}}]
    status = {"phase": "Running", "podIP": f"10.{at}.0.{rank}", "containerStatuses": trainer}
    spec = {"nodeName": f"n{at % NODES}", "containers": [{"resources": resources}]}
    return {"metadata": meta, "spec": spec, "status": status}


def operator(api: Api) -> Reconciler:
    cache = ChildCache(lambda key: None)
    peering = PeeringCheck(peering=None, cluster=api, trust_seconds=1)  # type: ignore[arg-type]
    made = Reconciler(config=OperatorConfig(), cluster=api, cache=cache, peering=peering)  # type: ignore[arg-type]
    made.context.capture()
    return made


def fill(n: int) -> tuple[Api, Reconciler]:
    """N jobs, each with its attempt Job (made by its first reconcile) and 2 running pods."""
    api = Api()
    made = operator(api)
    for i in range(n):
        name = f"j{i}"
        made.bodies.offer((NS, name), api.add(name))  # kopf's watch delivers the new job
        made.reconcile(NS, name)
        for rank in range(2):
            seen = pod(name, rank, i)
            made.cache.apply("pods", "ADDED", seen)
            api.pods.append(seen)
        made.reconcile(NS, name)  # its pods run: the job is Running
    return api, made


def timed(call: Callable[[], None], repeats: int) -> tuple[float, float]:
    """The best (CPU of this thread, wall) seconds of `repeats` calls."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        cpu, wall = time.thread_time(), time.perf_counter()
        call()
        best = min(best, (time.thread_time() - cpu, time.perf_counter() - wall))
    return best


def measure(n: int, repeats: int) -> None:
    api, made = fill(n)
    phases = {b.get("status", {}).get("phase") for b in api.bodies.values()}
    assert phases == {"Running"}, phases
    keys, patches = sorted(api.bodies), api.patches

    def tick() -> None:
        for key in keys:
            made.reconcile(*key)

    cpu, wall = timed(tick, repeats)
    assert api.patches == patches, "a quiet tick writes nothing"
    spec, status = MixedPrecisionJobSpec.model_validate(ELASTIC), MixedPrecisionJobStatus.model_validate(BELOW)
    room = capacity.RoomReader(api, fresh_seconds=3600)  # type: ignore[arg-type]  # one read for every job

    def grow() -> None:
        for _, name in keys:
            capacity.fits_now(room, spec, status, namespace=NS, job=name)

    grow()  # the shared read, out of the timing
    rcpu, rwall = timed(grow, repeats)
    us = 1e6 / n
    print(f"N={n}: tick reconcile per job {cpu * us:.0f} us CPU ({wall * us:.0f} us wall); "
          f"elastic room per job {rcpu * us:.1f} us CPU ({rwall * us:.1f} us wall)", flush=True)  # fmt: skip


def finished(n: int) -> tuple[int, int, float]:
    """The bodies held, the other entries held per job (settled, phases, rebuilt), and the MiB
    the operator holds in all, after kopf's listing of N finished jobs and one reconcile of each
    (as when each finished)."""
    api = Api()
    made = operator(api)
    queue = WorkQueue(cast(Any, made.handle), workers=0)  # keys stay queued: no reconcile runs from it
    watched: Any = on_job_event  # kopf types its handlers by its full keyword signature
    memo = {"controller": Controller(OperatorConfig(), api, made.cache, queue, made, Liveness("mpjs", list))}  # type: ignore[arg-type]

    async def listing() -> None:
        for i in range(n):
            body = api.add(f"d{i}")
            api.bodies[(NS, f"d{i}")]["status"] = body["status"] = copy.deepcopy(FINISHED)
            event = {"type": None, "object": body}
            await watched(type=None, body=body, event=event, namespace=NS, name=f"d{i}", memo=memo)

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    asyncio.run(listing())
    for i in range(n):
        made.reconcile(NS, f"d{i}")
    held, entries = len(made.bodies), len(made.settled) + len(made.phases) + len(made.actions.rebuilt)
    api.bodies.clear()  # the harness API server's own copies: what stays is what the operator holds
    mib = (tracemalloc.get_traced_memory()[0] - before) / 2**20
    tracemalloc.stop()
    queue.close()
    return held, entries, mib


def failure_drop(n: int, repeats: int) -> float:
    """Microseconds of CPU to remove one FailedCreate Event with N held (100 removals timed)."""
    best = float("inf")
    for _ in range(repeats):
        children = Children()
        for i in range(n):
            children.put(CreateFailure(f"ev-{i}", ObjectRef(NS, "Job", f"j{i}-a0", f"job-{i}"), "forbidden"))
        cpu = time.thread_time()
        for i in range(0, n, max(1, n // 100)):
            children.drop("events", f"ev-{i}")
        best = min(best, (time.thread_time() - cpu) / len(range(0, n, max(1, n // 100))))
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobs", type=int, nargs="*", default=[100, 1000, 3000], help="N jobs, one run each")
    parser.add_argument("--repeats", type=int, default=3, help="timed ticks per N (best kept)")
    args = parser.parse_args()
    kopf.event = lambda *args, **kwargs: None  # no API server to post Events to: they are the same per job
    for n in args.jobs:
        measure(n, args.repeats)
        held, entries, mib = finished(n)
        print(f"N={n} finished: {held} bodies, {entries} other entries held (the operator holds {mib:.1f} MiB more); "
              f"FailedCreate removal {failure_drop(n, args.repeats):.1f} us CPU", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
