"""What a job's queue says about an attempt Job it has not admitted (yet, or again): Kueue's
Workload for the Job, found by the label Kueue gives it (`kueue.x-k8s.io/job-uid`), and its
QuotaReserved=False message ("couldn't assign flavors to pod set main: insufficient unused
quota for nvidia.com/gpu ...") or, else, its Evicted message. The reconcile asks only for a
job with runPolicy.queueName whose current attempt Job waits suspended, and puts the answer in
the job's Running condition, so `kubectl describe mpj` says why it waits.

For an elastic job (spec.elastic) in a queue the free quota is its room, not the nodes' free
GPUs: its LocalQueue (spec.clusterQueue) names the ClusterQueue whose `nvidia.com/gpu`
nominalQuota, less what it has reserved (status.flavorsReservation, else flavorsUsage), holds
so many more workers; the job's own admitted workers count as its. `room` reads them (get on
localqueues and clusterqueues, read only) only while the attempt's Job waits suspended or runs
below `workers`; the reconcile shrinks a Job that waited past elastic.waitSeconds with the
quota short (`quota_short`) and grows a smaller attempt when the quota is raised.

Where Kueue is not installed (404) or the operator may not list Workloads (403: a chart
without that rule) it answers None and does not ask again for `quiet.QUIET_SECONDS`: the status then
says that the attempt waits, without the queue's words. Any other error is a None this time.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from mpjob.builders.devices import GPU_RESOURCE as GPU
from mpjob.controller.cache import Observed
from mpjob.controller.cluster import Cluster
from mpjob.controller.quiet import QuietReads
from mpjob.planning import history
from mpjob.planning.elastic import workers_of
from mpjob.planning.endings import JobView
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
LOCAL_QUEUES, CLUSTER_QUEUES = "localqueues", "clusterqueues"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


def workload_message(workload: dict[str, Any]) -> str | None:
    """Why Kueue holds a Workload back: its quota verdict first, else its eviction."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind, status in (("QuotaReserved", "False"), ("Evicted", "True")):
        cond = conditions.get(kind) or {}
        if cond.get("status") == status and cond.get("message"):
            return str(cond["message"])
    return None


def quota_short(workload: dict[str, Any]) -> bool:
    """Kueue found no quota for the Workload: QuotaReserved=False (its reason Pending)."""
    conditions = (workload.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "QuotaReserved" and c.get("status") == "False" for c in conditions)


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _gpus(flavors: list[dict[str, Any]], key: str) -> int:
    return sum(_quantity(r.get(key, 0)) for f in flavors for r in f.get("resources") or [] if r.get("name") == GPU)


def free_gpus(cluster_queue: dict[str, Any]) -> int:
    """The ClusterQueue's `nvidia.com/gpu` quota not reserved now (its nominal quota over every
    resource group and flavor, less its reservation; borrowing from a cohort is not counted)."""
    groups = (cluster_queue.get("spec") or {}).get("resourceGroups") or []
    quota = _gpus([f for g in groups for f in g.get("flavors") or []], "nominalQuota")
    status = cluster_queue.get("status") or {}
    taken = _gpus(status.get("flavorsReservation") or status.get("flavorsUsage") or [], "total")
    return max(0, quota - taken)


def queue_workers(spec: MixedPrecisionJobSpec, cluster_queue: dict[str, Any], own_workers: int) -> int | None:
    """Workers of the job the queue's free quota holds, its `own_workers` (admitted, so counted in
    the reservation) included (None: a CPU job, which the GPU quota does not size)."""
    per_worker = spec.resources.gpus_per_worker
    if per_worker == 0:
        return None
    return own_workers + free_gpus(cluster_queue) // per_worker


class QueueReader:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        #: Reads of Kueue's objects by kind; None on an error (quiet after a 403 or 404).
        self._read = QuietReads().read

    def workload(self, namespace: str, job_uid: str) -> dict[str, Any] | None:
        """Kueue's Workload for the attempt Job with this UID, or None."""
        selector = f"{JOB_UID_LABEL}={job_uid}"
        custom = self.cluster.custom
        listed = self._read(PLURAL, custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                            label_selector=selector)  # fmt: skip
        return next(iter((listed or {}).get("items") or []), None)

    def message(self, namespace: str, job_uid: str) -> str | None:
        """Kueue's words on the attempt Job with this UID, or None."""
        workload = self.workload(namespace, job_uid)
        return workload_message(workload) if workload is not None else None

    def with_words(
        self, namespace: str, spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, seen: Observed
    ) -> dict[int, JobView]:
        """The attempt Jobs, the running attempt's with its queue's words while it waits suspended."""
        if not (spec.run_policy.queue_name and status.attempts):
            return seen.jobs
        index = history.job_index(status, status.attempts[-1].index)
        job, uid = seen.jobs.get(index), seen.uids.get(index)
        if job is None or uid is None or not job.suspended or job.finished:
            return seen.jobs
        workload = self.workload(namespace, uid)
        words = workload_message(workload) if workload is not None else None
        if not words:
            return seen.jobs
        return {**seen.jobs, index: replace(job, queue_message=words, quota_short=quota_short(workload or {}))}

    def room(
        self, namespace: str, spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, jobs: dict[int, JobView]
    ) -> int | None:
        """Workers of an elastic queued job its ClusterQueue's quota holds now, read only while its
        running attempt's Job waits suspended or runs below `workers` (None otherwise, or unread)."""
        queue_name, current = spec.run_policy.queue_name, status.attempts[-1] if status.attempts else None
        if spec.elastic is None or not queue_name or current is None or current.finish_time is not None:
            return None
        job = jobs.get(history.job_index(status, current.index))
        workers = workers_of(spec, current)
        if job is None or job.finished or not (job.suspended or workers < spec.workers):
            return None
        custom = self.cluster.custom
        local = self._read(LOCAL_QUEUES, custom.get_namespaced_custom_object, GROUP, VERSION, namespace,
                           LOCAL_QUEUES, queue_name)  # fmt: skip
        name = ((local or {}).get("spec") or {}).get("clusterQueue")
        if not name:
            return None
        cluster_queue = self._read(CLUSTER_QUEUES, custom.get_cluster_custom_object, GROUP, VERSION,
                                   CLUSTER_QUEUES, name)  # fmt: skip
        if cluster_queue is None:
            return None
        return queue_workers(spec, cluster_queue, 0 if job.suspended else workers)
