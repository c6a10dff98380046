"""How many workers of a job the cluster's GPU nodes hold now: what an elastic job
(spec.elastic) running below `workers` grows on.

Pure (the reconciler reads, this counts) over Node and Pod documents as the API returns them;
the operator lists them with read rights only (nodes, and pods of every namespace). A node
counts when it is Ready, schedulable, carries the GPU Feature Discovery labels the attempt's
pods ask for (compute capability at least resources.minComputeCapability) and every label of
template.nodeSelector, and the pods tolerate each of its NoSchedule and NoExecute taints (the
GPU taint the operator tolerates, and template.tolerations). Its free GPUs are its allocatable
`nvidia.com/gpu` less what the pods bound to it and not yet ended request, the job's own pods
left out (their GPUs are the job's). Each worker needs gpusPerWorker GPUs on one node. A CPU
job (gpusPerWorker 0) has no such count: it does not grow on a cluster. `fits_now` reads them
only for an elastic job whose running attempt has fewer workers than it wants.

A read is a LIST of the GPU nodes and of the pods of every namespace, so it is shared: one
`RoomReader` answers every job's reconcile for a tick (at most one read a window
however many elastic jobs wait to grow; a growth is seen up to that much later), and it keeps
only what counts (nodes labelled by GPU Feature Discovery, pods bound to a node that request
GPUs), not the whole listing. What is per node (eligible, free GPUs, workers held) is counted
once a read for all jobs that ask the same of the nodes (`Share`); a job's count then walks only
the nodes its own pods are on, so a tick's counts cost O(nodes + jobs), not O(nodes x jobs).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mpjob.builders.attempt import GPU_MAJOR_LABEL, GPU_MINOR_LABEL, LABEL_JOB
from mpjob.builders.devices import GPU_RESOURCE as GPU
from mpjob.controller.quiet import QuietReads
from mpjob.planning.elastic import workers_of
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

if TYPE_CHECKING:
    from mpjob.controller.cluster import Cluster


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a toleration matches the taint (the scheduler's rule: an empty key with Exists
    matches every key, an empty effect every effect; Equal also needs the value)."""
    for toleration in tolerations:
        key, effect = toleration.get("key") or "", toleration.get("effect") or ""
        if (key and key != taint.get("key")) or (effect and effect != taint.get("effect")):
            continue
        if toleration.get("operator") == "Exists" or (key and toleration.get("value") == taint.get("value")):
            return True
    return False


def _schedulable(node_spec: Mapping[str, Any], spec: MixedPrecisionJobSpec) -> bool:
    """The node is not cordoned and the attempt's pods tolerate its hard taints."""
    tolerations = [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}, *spec.template.tolerations]
    hard = [t for t in node_spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    return not node_spec.get("unschedulable") and all(_tolerated(t, tolerations) for t in hard)


def _eligible(node: Mapping[str, Any], spec: MixedPrecisionJobSpec) -> bool:
    meta, node_spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    labels = meta.get("labels") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if not ready or not _schedulable(node_spec, spec):
        return False
    major, minor = (int(x) for x in spec.resources.min_compute_capability.split("."))
    try:
        capability = (int(labels[GPU_MAJOR_LABEL]), int(labels[GPU_MINOR_LABEL]))
    except (KeyError, ValueError):
        return False
    wanted = spec.template.node_selector or {}
    return capability >= (major, minor) and all(labels.get(k) == v for k, v in wanted.items())


def requested_gpus(pod: Mapping[str, Any]) -> int:
    """The GPUs a pod's containers request (0: none, or not a count)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    total = 0
    for container in containers:
        resources = container.get("resources") or {}
        total += _quantity((resources.get("requests") or {}).get(GPU, (resources.get("limits") or {}).get(GPU, 0)))
    return total


def _bound(pod: Mapping[str, Any]) -> str | None:
    """The node a pod not ended is bound to (None: unbound, or ended: its GPUs are free)."""
    node = (pod.get("spec") or {}).get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    return str(node) if node and phase not in ("Succeeded", "Failed") else None


Requirement = tuple[str, tuple[tuple[str, str], ...], str, int]


def requirement(spec: MixedPrecisionJobSpec) -> Requirement:
    """What a job asks of a node (compute capability, nodeSelector, tolerations) and of its GPUs
    (gpusPerWorker): jobs that ask the same share one count of the nodes."""
    selector = tuple(sorted((spec.template.node_selector or {}).items()))
    tolerations = json.dumps(spec.template.tolerations, sort_keys=True, default=str)
    return spec.resources.min_compute_capability, selector, tolerations, spec.resources.gpus_per_worker


@dataclass(frozen=True, slots=True)
class Share:
    """The nodes as jobs of one requirement see them: each eligible node's GPUs that no pod
    takes (`free`, below 0 when requests exceed it) and the workers of `per_worker` GPUs those hold."""

    free: Mapping[str, int]
    workers: int
    per_worker: int

    def workers_for(self, own: Mapping[str, int]) -> int:
        """The workers a job holds whose own pods take `own` GPUs by node (theirs are its)."""
        fit = self.workers
        for node, gpus in own.items():
            if (free := self.free.get(node)) is not None:
                fit += max(0, free + gpus) // self.per_worker - max(0, free) // self.per_worker
        return fit


@dataclass(frozen=True, slots=True)
class Room:
    """What one read showed, kept as the sums a job's count reads (one pass over the pods per
    read, however many jobs ask): the GPU nodes; by node, the GPUs its pods not ended request;
    by job (namespace, the `mpjob.dev/job` label), by node, the GPUs that job's own pods take;
    and by requirement, the nodes' count, made for the first job that asks (`share`)."""

    nodes: tuple[Mapping[str, Any], ...]
    used: Mapping[str, int]
    own: Mapping[tuple[str, str], Mapping[str, int]]
    shares: dict[Requirement, Share] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> Room:
        used: dict[str, int] = {}
        own: dict[tuple[str, str], dict[str, int]] = {}
        for pod in pods:
            if (node := _bound(pod)) is None or (gpus := requested_gpus(pod)) == 0:
                continue
            used[node] = used.get(node, 0) + gpus
            meta = pod.get("metadata") or {}
            if (job := (meta.get("labels") or {}).get(LABEL_JOB)) is not None:
                mine = own.setdefault((str(meta.get("namespace")), str(job)), {})
                mine[node] = mine.get(node, 0) + gpus
        return cls(tuple(nodes), used, own)

    def share(self, spec: MixedPrecisionJobSpec) -> Share:
        """The nodes' count for jobs that ask what `spec` asks (gpusPerWorker above 0), once a
        read (two threads that ask at once may both count: the same count, either kept)."""
        key = requirement(spec)
        if (share := self.shares.get(key)) is None:
            free: dict[str, int] = {}
            for node in self.nodes:
                if _eligible(node, spec):
                    name = str((node.get("metadata") or {}).get("name", ""))
                    allocatable = _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))
                    free[name] = allocatable - self.used.get(name, 0)
            per_worker = spec.resources.gpus_per_worker
            workers = sum(max(0, gpus) // per_worker for gpus in free.values())
            share = self.shares[key] = Share(free, workers, per_worker)
        return share


def free_workers(
    spec: MixedPrecisionJobSpec,
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    *,
    namespace: str,
    job: str,
) -> int | None:
    """Workers of the job `namespace/job` the GPU nodes hold beside everything else running now,
    the GPUs its own pods take counted as its (None: a CPU job, whose room the nodes do not say)."""
    return room_workers(spec, Room.of(nodes, pods), namespace=namespace, job=job)


def room_workers(spec: MixedPrecisionJobSpec, room: Room, *, namespace: str, job: str) -> int | None:
    """`free_workers` of a room read already: its nodes and sums, no pod walked again."""
    if spec.resources.gpus_per_worker == 0:
        return None
    return room.share(spec).workers_for(room.own.get((namespace, job), {}))


class RoomReader:
    """The cluster's room, read at most once per `fresh_seconds` for every job of the operator
    (reconciles of several jobs at once wait for one read). A read that failed answers None for
    its window too: no job grows then. One refused for good (403: a chart without
    rbac.elasticCapacity) is said once and not asked again for `quiet.QUIET_SECONDS` (`QuietReads`)."""

    def __init__(self, cluster: Cluster, *, fresh_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster, self.fresh_seconds = cluster, fresh_seconds
        self._clock = clock
        self._reads = QuietReads(clock=clock)
        self._lock = threading.Lock()
        self._last: tuple[float, Room | None] | None = None

    def room(self) -> Room | None:
        with self._lock:
            now, last = self._clock(), self._last
            if last is not None and now - last[0] < self.fresh_seconds:
                return last[1]
            room = self._read()
            self._last = (now, room)
            return room

    def _read(self) -> Room | None:
        if (read := self._reads.ask("nodes and pods for spec.elastic", self.cluster.gpu_room)) is None:
            return None
        return Room.of(*read)


def fits_now(
    room: RoomReader, spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, *, namespace: str, job: str
) -> int | None:
    """`free_workers` for an elastic job whose running attempt is below `workers` (None for any
    other, or when the operator may not read nodes and pods: it does not grow then)."""
    current = status.attempts[-1] if status.attempts else None
    if spec.elastic is None or current is None or current.finish_time is not None:
        return None
    if workers_of(spec, current) >= spec.workers or spec.resources.gpus_per_worker == 0:
        return None
    if (seen := room.room()) is None:
        return None
    return room_workers(spec, seen, namespace=namespace, job=job)
