"""Every call the operator makes to the API server outside its cache's watches: read a
MixedPrecisionJob, write its status, create and delete an attempt's children, read kopf's
peering object. The Helm chart's RBAC grants exactly these (tests/unit/test_chart.py reads
this package for the client methods it calls).

Reads and creates go through `raw` (plain JSON, no typed models: the operator's largest CPU
cost at hundreds of jobs), as do the cache's listings. What is already as wanted (a child of
ours that exists, one that is gone) is not an error: a restarted operator re-derives the same
attempt. An object of a child's name that mpjob did not create is never adopted nor deleted.
A refusal the API server would repeat (`planning.classify.API_ERROR_POLICY`) raises `Refused`
with the server's message; anything else propagates, and the reconcile is retried with backoff.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf
from kubernetes import client
from kubernetes.client.rest import ApiException

from mpjob import credentials
from mpjob.builders.attempt import GPU_MAJOR_LABEL, attempt_name
from mpjob.controller import documents
from mpjob.controller.ownership import Claim, claim
from mpjob.planning.classify import NAME_CONFLICT, ApiAction, ApiRule, classify_api_error
from mpjob_contract import api

CONFLICT, NOT_FOUND = 409, 404
log = logging.getLogger("mpjob.operator")
#: (connect, read) seconds for one request: a hung connection must not hold a worker forever.
REQUEST_TIMEOUT = (5.0, 30.0)


class Refused(Exception):
    """The API server refused a child for good: `rule` says why, `message` is the server's."""

    def __init__(self, rule: ApiRule, message: str) -> None:
        super().__init__(f"{rule.reason}: {message}")
        self.rule, self.message = rule, message


class NameInUse(Exception):
    """A child's name is held by a same-named job's child from before it was deleted and
    created again; the garbage collector frees it soon (retried with backoff)."""


def raw(call: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """A Kubernetes client call's JSON as plain dicts: the client's typed models cost several
    milliseconds of CPU per object, the operator's largest cost at hundreds of jobs."""
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
    response = call(*args, _preload_content=False, **kwargs)
    try:
        return dict(documents.loads(response.data))
    finally:
        response.release_conn()


def load_credentials() -> None:
    """The client's default credentials: the pod's ServiceAccount, or the kubeconfig outside a cluster."""
    credentials.load_default()


def status_message(body: str | bytes | None) -> str | None:
    """The message of an API server's Status body; None when the body is not one (or its message
    is not text)."""
    if not body:
        return None
    try:
        status = documents.loads(body)
    except ValueError:
        return None
    message = status.get("message") if isinstance(status, dict) else None
    return message if isinstance(message, str) else None


def server_message(exc: ApiException) -> str:
    """The API server's own words for a refusal (its Status message), else the HTTP reason."""
    return status_message(exc.body) or exc.reason or f"HTTP {exc.status}"


class Cluster:
    """The Kubernetes API clients of one operator process."""

    def __init__(self, *, custom: Any, batch: Any, core: Any, networking: Any = None) -> None:
        self.custom, self.batch, self.core, self.networking = custom, batch, core, networking

    @classmethod
    def connect(cls) -> Cluster:
        """Clients for the pod's ServiceAccount, or for the kubeconfig outside a cluster."""
        load_credentials()
        return cls(
            custom=client.CustomObjectsApi(),
            batch=client.BatchV1Api(),
            core=client.CoreV1Api(),
            networking=client.NetworkingV1Api(),
        )

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

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """Merge `status` (camelCase fields; None deletes one) into the job's status subresource;
        the job as written (its new resourceVersion, spec and status). With `resource_version`
        the write holds only if the job is still at that version (else a 409 Conflict): a status
        planned from an older read, by a second operator or one that stalled, never overwrites
        a newer one."""
        body: dict[str, Any] = {"status": status}
        if resource_version is not None:
            body["metadata"] = {"resourceVersion": resource_version}
        custom = self.custom
        return raw(
            custom.patch_namespaced_custom_object_status, api.GROUP, api.VERSION, namespace, api.PLURAL, name, body
        )

    # -------------------------------------------------------------- an attempt's children
    def create_job(self, job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        """Create an attempt's Job, controlled by the MixedPrecisionJob `owner`: the Job as the
        API server returned it, or the one of ours that exists already."""
        batch, meta = self.batch, owner["metadata"]
        kopf.adopt(job, owner=cast(kopf.Body, owner))
        name, namespace = job["metadata"]["name"], meta["namespace"]
        try:
            return _refusing(lambda: raw(batch.create_namespaced_job, namespace, job))
        except _Exists:
            existing = raw(batch.read_namespaced_job, name, namespace)
            _check_claim(existing, f"Job {name}", owners={meta["uid"]: (api.KIND, meta["name"])})
            return existing

    def create_service(self, service: dict[str, Any], *, job: dict[str, Any], owner: dict[str, Any]) -> None:
        """Create an attempt's headless Service, controlled by its Job (so it goes with the Job;
        the operator deletes a Service only when that Job left it: controller/leftovers.py). One
        of ours that exists already is left as is (an operator before this one made it
        controlled by the MixedPrecisionJob)."""
        core, earlier = self.core, {uid_of(owner): (api.KIND, owner["metadata"]["name"])}
        calls = (core.create_namespaced_service, core.read_namespaced_service)
        _create_job_child(service, "Service", job=job, calls=calls, also_ours=earlier)

    def create_network_policy(self, policy: dict[str, Any], *, job: dict[str, Any]) -> None:
        """Create an attempt's NetworkPolicy, controlled by its Job (it goes with the Job; the
        operator deletes one only when that Job left it: controller/leftovers.py). One of ours
        that exists already is left as is."""
        networking = self.networking
        calls = (networking.create_namespaced_network_policy, networking.read_namespaced_network_policy)
        _create_job_child(policy, "NetworkPolicy", job=job, calls=calls)

    def create_secret(self, secret: dict[str, Any], *, owner: dict[str, Any]) -> None:
        """Create the job's profile-token Secret, controlled by the MixedPrecisionJob `owner`
        (it goes with the job; asked before each attempt's Job, it is made before the first).
        The operator never reads a Secret: one of that name that exists already is left as it
        is, unread (whoever made it can only break their own profiles).
        Profiles are an extra: a refusal (an older chart's RBAC, a quota) is logged and the
        attempt runs without its token, answering no profile request."""
        core, namespace = self.core, owner["metadata"]["namespace"]
        kopf.adopt(secret, owner=cast(kopf.Body, owner))
        try:
            _refusing(lambda: raw(core.create_namespaced_secret, namespace, secret))
        except _Exists:
            pass
        except Refused as refused:
            name = secret["metadata"]["name"]
            log.warning("%s/%s: the profile token's Secret was refused (%s): no profiles", namespace, name, refused)

    def delete_job(self, namespace: str, job: str, *, index: int, uid: str) -> bool:
        """Delete attempt `index`'s Job, if it is still the one whose UID is `uid` (its pods go
        in the background: SIGTERM, then a checkpoint; its Service with it); whether it was."""
        batch, name = self.batch, attempt_name(job, index)
        options = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        try:
            batch.delete_namespaced_job(name, namespace, body=options, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status not in (NOT_FOUND, CONFLICT):  # gone, or another object took the name
                raise
            return False
        return True

    def cut_pod(self, namespace: str, pod: str, *, uid: str, grace: int) -> bool:
        """Delete an attempt's pod, if it is still the one whose UID is `uid`, with `grace`
        seconds before SIGKILL; whether it was. Only a pod's first deletion counts: the API
        server records a shorter grace given later, but a kubelet runs out the one its stop
        began with. Anything but the pod's being gone is logged, not raised: the attempt has
        ended in the status already, and the pod still goes, with its own grace period."""
        options = {"preconditions": {"uid": uid}, "gracePeriodSeconds": grace}
        try:
            self.core.delete_namespaced_pod(pod, namespace, body=options, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status not in (NOT_FOUND, CONFLICT):  # gone, or another pod took the name
                why = f"{exc.status} {exc.reason}"
                log.warning("%s/%s: not cut short (%s): it keeps its grace period", namespace, pod, why)
            return False
        return True

    # -------------------------------------------------------------- room for an elastic job
    def gpu_room(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The GPU nodes (those GPU Feature Discovery labelled), and the pods of every namespace
        bound to a node that have not ended (read rights only): the API server leaves out the rest."""
        nodes = raw(self.core.list_node, label_selector=GPU_MAJOR_LABEL).get("items") or []
        selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        pods = raw(self.core.list_pod_for_all_namespaces, field_selector=selector)
        return nodes, pods.get("items") or []

    def resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        """The ResourceQuotas of `namespace` (read rights only), as the API returns them."""
        return raw(self.core.list_namespaced_resource_quota, namespace).get("items") or []

    # -------------------------------------------------------------- kopf peering
    def read_peering(self, name: str, namespace: str | None) -> dict[str, Any]:
        """kopf's peering object: the cluster-wide one (namespace None) or a namespace's."""
        custom = self.custom
        if namespace is None:
            return raw(custom.get_cluster_custom_object, "kopf.dev", "v1", "clusterkopfpeerings", name)
        return raw(custom.get_namespaced_custom_object, "kopf.dev", "v1", namespace, "kopfpeerings", name)


class _Exists(Exception):
    """A create answered 409: an object of that name exists (whose is for the caller to say)."""


def _create_job_child(
    body: dict[str, Any],
    kind: str,
    *,
    job: dict[str, Any],
    calls: tuple[Any, Any],
    also_ours: dict[str, tuple[str, str]] | None = None,
) -> None:
    """Create `body` controlled by the attempt's `job` with `calls` (create, read); an existing
    object of its name is left as is when its controller is the Job (or one of `also_ours`),
    else refused as somebody else's (`_check_claim`)."""
    create, read = calls
    namespace, name = job["metadata"]["namespace"], body["metadata"]["name"]
    kopf.append_owner_reference(body, owner=cast(kopf.Body, job), block_owner_deletion=False)
    try:
        _refusing(lambda: raw(create, namespace, body))
    except _Exists:
        owners = {uid_of(job): ("Job", job["metadata"]["name"]), **(also_ours or {})}
        _check_claim(raw(read, name, namespace), f"{kind} {name}", owners=owners)


def _refusing(call: Any) -> Any:
    """`call()` (a create), with the API server's answers sorted: 409 raises `_Exists`, a
    refusal the policy calls permanent raises `Refused`, anything else propagates."""
    try:
        return call()
    except ApiException as exc:
        if exc.status == CONFLICT:
            raise _Exists from exc
        rule = classify_api_error(exc.status)
        if rule.action is ApiAction.FAIL:
            raise Refused(rule, server_message(exc)) from exc
        raise


def uid_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def _check_claim(existing: dict[str, Any], what: str, *, owners: dict[str, tuple[str, str]]) -> None:
    """Nothing when `existing` is ours; NameInUse when it is a deleted job's, still going;
    Refused (NameConflict) when mpjob did not create it."""
    whose = claim(existing, owners=owners)
    if whose is Claim.STALE:
        raise NameInUse(f"{what} of an earlier job of the same name is still being deleted")
    if whose is Claim.FOREIGN:
        raise Refused(NAME_CONFLICT, f"{what} already exists and was not created by mpjob for this job")
