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
best of `--repeats`.

Usage: PYTHONPATH=operator:contract:trainer-image:. python bench/operator_tick.py 100 1000 3000
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from typing import Any

import kopf

from mpjob.controller import capacity
from mpjob.controller.cache import ChildCache
from mpjob.controller.config import OperatorConfig
from mpjob.controller.peering import PeeringCheck
from mpjob.controller.reconciler import Reconciler
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

NS, NODES, GPUS_PER_NODE = "team", 64, 8
SPEC = {"workers": 2, "task": {"builtin": "mlp"}, "resources": {"gpusPerWorker": 1, "minComputeCapability": "8.0"}}
ELASTIC = {**SPEC, "workers": 4, "elastic": {"minWorkers": 1, "waitSeconds": 60}}
BELOW = {"phase": "Running", "attempt": 0, "attempts": [{"index": 0, "precision": "fp16", "worldSize": 2}]}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("jobs", type=int, nargs="*", default=[100, 1000, 3000], help="N jobs, one run each")
    parser.add_argument("--repeats", type=int, default=3, help="timed ticks per N (best kept)")
    args = parser.parse_args()
    kopf.event = lambda *args, **kwargs: None  # no API server to post Events to: they are the same per job
    for n in args.jobs:
        measure(n, args.repeats)


if __name__ == "__main__":
    main()
