"""What a job's queue says about an attempt Job it has not admitted (yet, or again): Kueue's
Workload for the Job, found by the label Kueue gives it (`kueue.x-k8s.io/job-uid`), and its
QuotaReserved=False message ("couldn't assign flavors to pod set main: insufficient unused
quota for nvidia.com/gpu ...") or, else, its Evicted message. The reconcile asks only for a
job with runPolicy.queueName whose current attempt Job waits suspended, and puts the answer in
the job's Running condition, so `kubectl describe mpj` says why it waits.

Where Kueue is not installed (404) or the operator may not list Workloads (403: a chart
without that rule) it answers None and does not ask again for QUIET_SECONDS: the status then
says that the attempt waits, without the queue's words. Any other error is a None this time.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from kubernetes.client.rest import ApiException

from mpjob.controller.cache import Observed
from mpjob.controller.cluster import Cluster, raw
from mpjob.planning import history
from mpjob.planning.endings import JobView
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

GROUP, VERSION, PLURAL = "kueue.x-k8s.io", "v1beta1", "workloads"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
QUIET_SECONDS = 300.0


def workload_message(workload: dict[str, Any]) -> str | None:
    """Why Kueue holds a Workload back: its quota verdict first, else its eviction."""
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    for kind, status in (("QuotaReserved", "False"), ("Evicted", "True")):
        cond = conditions.get(kind) or {}
        if cond.get("status") == status and cond.get("message"):
            return str(cond["message"])
    return None


class QueueReader:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._quiet_until = 0.0

    def message(self, namespace: str, job_uid: str) -> str | None:
        """Kueue's words on the attempt Job with this UID, or None."""
        if time.monotonic() < self._quiet_until:
            return None
        selector = f"{JOB_UID_LABEL}={job_uid}"
        try:
            custom = self.cluster.custom
            listed = raw(custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                         label_selector=selector)  # fmt: skip
        except ApiException as exc:
            if exc.status in (403, 404):
                self._quiet_until = time.monotonic() + QUIET_SECONDS
            return None
        for workload in listed.get("items") or []:
            return workload_message(workload)
        return None

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
        words = self.message(namespace, uid)
        return {**seen.jobs, index: replace(job, queue_message=words)} if words else seen.jobs
