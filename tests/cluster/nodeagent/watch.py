"""The agent's view of the pods: list, then watch, every pod in the cluster, and act on
those the scheduler bound to our nodes, level-triggered (each event carries the whole pod):

- bound, not started, not ended: start it (a pod that fails to start is Failed/StartError);
- held (its container's env names a Secret or ConfigMap, or a key, not there): Pending with
  CreateContainerConfigError, tried again every CONFIG_RETRY_SECONDS and on each event of it,
  as a kubelet's pod worker does (its back-off is 10s), and started once what it names is there;
  the same with ErrImagePull, then ImagePullBackOff, while its image's registry fails (registry.py);
- deletionTimestamp set: stop it gracefully in a thread of its own (SIGTERM, the pod's grace
  period, SIGKILL), or remove the object at once if nothing of it runs here;
- gone from the API (DELETED, or missing from a fresh list): kill its processes now;
- bound to a node whose Node object is gone, or that is silent (nodes.py): left alone, as no
  kubelet is there (a silent node's pods are acted on as they are when it answers again).

A 410 Gone or an ERROR event lists again; any other failure is logged and retried.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.log import log
from tests.cluster.nodeagent.nodes import NODES
from tests.cluster.nodeagent.pods import PodLifecycle, remove_pod
from tests.cluster.nodeagent.state import AgentState

DEFAULT_GRACE_SECONDS = 30
WATCH_TIMEOUT_SECONDS = 60
CONFIG_RETRY_SECONDS = 5


class PodWatch:
    """The watch thread: keeps the pods running here in step with the API."""

    def __init__(self, core: Any, *, pods: PodLifecycle, state: AgentState, stop: threading.Event) -> None:
        self.core = core
        self.pods = pods
        self.state = state
        self.stop = stop
        self._rv: str | None = None  # resourceVersion to watch from; None: list first

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                if self._rv is None:
                    self._relist()
                self._follow()
            except ApiException as exc:
                if exc.status == 410:
                    self._rv = None
                else:
                    log(f"watch error: {exc.status} {exc.reason}")
                    time.sleep(1)
            except Exception as exc:
                log(f"watch error: {exc!r}")
                self._rv = None
                time.sleep(1)

    def _relist(self) -> None:
        listing = self.core.list_pod_for_all_namespaces()
        self._rv = listing.metadata.resource_version
        seen = set()
        for pod in listing.items:
            seen.add(pod.metadata.uid)
            self.reconcile(pod)
        for uid in list(self.state.running):
            if uid not in seen:
                self.pods.kill(self.state.running[uid], grace=0)
        for uid in list(self.state.held):
            if uid not in seen:
                self.state.release(uid)

    def _follow(self) -> None:
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=self._rv,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            allow_watch_bookmarks=True,
        )
        for event in stream:
            if self.stop.is_set():
                return
            obj = event["object"]
            if event["type"] == "ERROR" or isinstance(obj, dict):
                self._rv = None  # e.g. 410 Gone: list again
                return
            self._rv = obj.metadata.resource_version
            if event["type"] == "DELETED":
                self.state.release(obj.metadata.uid)
                rec = self.state.running.get(obj.metadata.uid)
                if rec and rec.node not in self.state.silent_nodes:  # else killed when it answers
                    self.pods.kill(rec, grace=0)
            elif event["type"] != "BOOKMARK":
                self.reconcile(obj)

    def reconcile(self, pod: Any) -> None:
        """Act on one observed pod: start it, stop it, or leave it."""
        node = pod.spec.node_name
        if node not in NODES or node in self.state.lost_nodes or node in self.state.silent_nodes:
            return  # not ours, or its machine is gone or silent: nobody acts on it or reports it
        if pod.metadata.deletion_timestamp:
            self._deleting(pod)
            return
        uid = pod.metadata.uid
        if uid in self.state.running or uid in self.state.done:
            return
        if pod.status and pod.status.phase in ("Succeeded", "Failed"):
            return
        with self.state.lock:
            if uid in self.state.running or uid in self.state.done:
                return
            try:
                self.pods.start(pod)
            except Exception as exc:
                log(f"pod {pod.metadata.namespace}/{pod.metadata.name} failed to start: {exc!r}")
                self.pods.fail_start(pod, str(exc))

    def retry_held(self) -> None:
        """The held-pods thread: every CONFIG_RETRY_SECONDS, read each held pod again and act on it
        (started once its Secret or ConfigMap is there; let go once it is gone or ended)."""
        while not self.stop.wait(CONFIG_RETRY_SECONDS):
            for uid, (namespace, name, *_) in list(self.state.held.items()):
                try:
                    pod = self.core.read_namespaced_pod(name, namespace)
                except Exception as exc:
                    if isinstance(exc, ApiException) and exc.status == 404:
                        self.state.release(uid)
                    else:
                        log(f"reading held pod {namespace}/{name}: {exc!r}")
                    continue
                if pod.metadata.uid != uid or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
                    self.state.release(uid)
                else:
                    self.reconcile(pod)

    def node_back(self, node: str) -> None:
        """A silent node answers again: act on its pods as they are now (a deletion that came
        meanwhile is carried out)."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        for pod in pods:
            self.reconcile(pod)
        listed = {pod.metadata.uid for pod in pods}
        for rec in [r for r in list(self.state.running.values()) if r.node == node and r.uid not in listed]:
            self.pods.kill(rec, grace=0)  # its pod went meanwhile

    def _deleting(self, pod: Any) -> None:
        meta = pod.metadata
        rec = self.state.running.get(meta.uid)
        if rec and not rec.deleting:  # a later, shorter grace does not cut a stop under way short: a
            rec.deleting = True  # kubelet's StopContainer runs out the grace it was first given
            grace = meta.deletion_grace_period_seconds
            if grace is None:
                grace = pod.spec.termination_grace_period_seconds or DEFAULT_GRACE_SECONDS
            threading.Thread(target=self.pods.delete, args=(rec, grace), daemon=True).start()
        elif not rec and not (meta.finalizers or []):
            self.state.release(meta.uid)
            with contextlib.suppress(ApiException):
                remove_pod(self.core, meta.name, meta.namespace, uid=meta.uid)
