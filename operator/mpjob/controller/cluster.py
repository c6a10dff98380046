"""Every call the operator makes to the API server outside its cache's watches: read a
MixedPrecisionJob, write its status, create and delete an attempt's children, read kopf's
peering object. The Helm chart's RBAC grants exactly these (tests/unit/test_chart.py reads
this package for the client methods it calls).

Reads and creates go through `raw` (plain JSON, no typed models: the operator's largest CPU
cost at hundreds of jobs), as do the cache's listings. What is already as wanted (a child that exists, one that is gone)
is not an error: a restarted operator re-derives the same attempt.
"""

from __future__ import annotations

import json
from typing import Any, cast

import kopf
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from mpjob.builders.attempt import attempt_name
from mpjob_contract import api

CONFLICT, NOT_FOUND = 409, 404


def raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A Kubernetes client call's JSON as plain dicts: the client's typed models cost several
    milliseconds of CPU per object, the operator's largest cost at hundreds of jobs."""
    response = call(*args, _preload_content=False, **kwargs)
    try:
        return dict(json.loads(response.data))
    finally:
        response.release_conn()


class Cluster:
    """The Kubernetes API clients of one operator process."""

    def __init__(self, *, custom: Any, batch: Any, core: Any) -> None:
        self.custom, self.batch, self.core = custom, batch, core

    @classmethod
    def connect(cls) -> Cluster:
        """Clients for the pod's ServiceAccount, or for the kubeconfig outside a cluster."""
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(custom=client.CustomObjectsApi(), batch=client.BatchV1Api(), core=client.CoreV1Api())

    # -------------------------------------------------------------- MixedPrecisionJobs
    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The MixedPrecisionJob as stored, or None when it is gone."""
        custom = self.custom
        try:
            return raw(custom.get_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL, name)
        except ApiException as exc:
            if exc.status == NOT_FOUND:
                return None
            raise

    def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Merge `status` (camelCase fields) into the job's status subresource."""
        custom = self.custom
        custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, {"status": status}
        )

    # -------------------------------------------------------------- an attempt's children
    def create_service(self, service: dict[str, Any], *, owner: dict[str, Any]) -> None:
        """Create an attempt's headless Service, owned by the job."""
        core = self.core
        kopf.adopt(service, owner=cast(kopf.Body, owner))
        _unless(CONFLICT, lambda: raw(core.create_namespaced_service, owner["metadata"]["namespace"], service))

    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any] | None:
        """Create an attempt's Job, owned by the job: the Job as the API server returned it, or
        None when it existed already."""
        batch = self.batch
        kopf.adopt(job, owner=cast(kopf.Body, owner))
        return _unless(CONFLICT, lambda: raw(batch.create_namespaced_job, owner["metadata"]["namespace"], job))

    def delete_attempt(self, namespace: str, job: str, index: int) -> None:
        """Delete an attempt's Job (its pods go in the background: SIGTERM, then a checkpoint) and Service."""
        batch, core, name = self.batch, self.core, attempt_name(job, index)
        _unless(NOT_FOUND, lambda: batch.delete_namespaced_job(name, namespace, propagation_policy="Background"))
        _unless(NOT_FOUND, lambda: core.delete_namespaced_service(name, namespace))

    # -------------------------------------------------------------- kopf peering
    def read_peering(self, name: str, namespace: str | None) -> dict[str, Any]:
        """kopf's peering object: the cluster-wide one (namespace None) or a namespace's."""
        custom = self.custom
        if namespace is None:
            return raw(custom.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name)
        return raw(custom.get_namespaced_custom_object, "kopf.dev", "v1", namespace, "kopfpeerings", name)


def _unless(status: int, call: Any) -> Any:
    """`call()`, or None when the API server answers `status` (the wanted state already holds)."""
    try:
        return call()
    except ApiException as exc:
        if exc.status != status:
            raise
        return None
