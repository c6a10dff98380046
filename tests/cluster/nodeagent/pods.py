"""One pod's life on this node, as kubelet lives it: prepare its sandbox (IP, volumes,
credentials, DNS name), run its init containers in order, pull its image (registry.py), start
its main container (or hold the pod Pending while its env names a Secret or ConfigMap not there,
or its image's registry fails), report its exit, and
restart or finish it by its restartPolicy; on deletion stop it gracefully.

Two regressions shaped this file. A pod keeps its IP across container restarts and agent
restarts (see `_sandbox`). Exit reporting runs in one thread for every pod, so a failure
while reporting one pod is logged and the thread goes on (it once died and left every
later pod Running).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent import freeze, registry
from tests.cluster.nodeagent.credentials import service_account_kubeconfig
from tests.cluster.nodeagent.environment import ContainerConfigError
from tests.cluster.nodeagent.hosts import pod_hosts
from tests.cluster.nodeagent.log import log, now
from tests.cluster.nodeagent.podstatus import (
    CONFIG_ERROR,
    patch_status,
    running_status,
    start_error_status,
    terminated_status,
    waiting_status,
)
from tests.cluster.nodeagent.processes import PodSandbox, ProcessRuntime, Started, termination_message
from tests.cluster.nodeagent.state import AgentState, PodProcess
from tests.cluster.nodeagent.volumes import volume_dirs

EXIT_POLL_SECONDS = 0.2


def remove_pod(core: Any, name: str, namespace: str, *, uid: str) -> None:
    """Delete the pod object now (grace 0), only if it is still the same pod."""
    core.delete_namespaced_pod(
        name,
        namespace,
        grace_period_seconds=0,
        body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": uid}),
    )


class PodLifecycle:
    """Starts, restarts, finishes and deletes the pods of this node's nodes."""

    def __init__(self, core: Any, *, state: AgentState, runtime: ProcessRuntime, server: str, ca: str) -> None:
        self.core = core
        self.state = state
        self.runtime = runtime
        self.server = server  # for the pods' ServiceAccount kubeconfigs
        self.ca = ca
        #: The warm-start servers' folder, where their stand-ins name the ranks forked for them.
        self.warm = Path(os.environ.get("MPJOB_WARM_DIR", "/nonexistent"))
        self.stopped: dict[str, list[int]] = {}  # a silent node -> the processes stopped on it

    def start(self, pod: Any) -> None:
        """Start a pod bound to one of our nodes, or hold it while its container's env names a
        Secret or ConfigMap (or key) not there; raises if it cannot start."""
        with self.state.lock:
            sandbox = self._sandbox(pod)
            for ctr in pod.spec.init_containers or []:
                self.runtime.run_init(sandbox, ctr)
            ctr = pod.spec.containers[0]
            try:
                registry.pull(self.core, pod.metadata.namespace, ctr.image or "")
                started = self.runtime.start(sandbox, ctr)
            except ContainerConfigError as exc:
                self._hold(sandbox, CONFIG_ERROR, str(exc))
                return
            except registry.ImagePullFailed as exc:
                held = self.state.held.get(pod.metadata.uid)
                again = held is not None and held[2] in (registry.PULLING, registry.BACKING_OFF)
                self._hold(sandbox, *registry.waiting(exc, ctr.image or "", again=again))
                return
            self.state.held.pop(sandbox.pod.metadata.uid, None)
            rec = _record(sandbox, ctr, started)
            self.state.running[rec.uid] = rec
            self.state.save()
            log(f"started {rec.namespace}/{rec.name} pid {rec.pid} ip {rec.ip}: {started.argv[:4]}")
            patch_status(self.core, rec.name, rec.namespace, status=running_status(rec))

    def _sandbox(self, pod: Any) -> PodSandbox:
        uid = pod.metadata.uid
        pod_dir = self.state.dirs.pods / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        # A pod keeps its IP for life (as with kubelet): podIPs is merged by ip, so a second
        # address would make every later status patch invalid (one IP per family).
        ip = (pod.status.pod_ip if pod.status else None) or self.state.next_ip()
        volumes = volume_dirs(self.core, pod, pod_dir=pod_dir, volumes_dir=self.state.dirs.volumes)
        kubeconfig = service_account_kubeconfig(self.core, pod, pod_dir=pod_dir, server=self.server, ca=self.ca)
        hosts = pod_hosts(pod, ip)
        self.state.set_hosts(uid, hosts)
        return PodSandbox(pod=pod, ip=ip, pod_dir=pod_dir, volumes=volumes, kubeconfig=kubeconfig, hosts=hosts)

    def _hold(self, sandbox: PodSandbox, reason: str, message: str) -> None:
        """Pending, its container waiting (`reason`: CreateContainerConfigError, ErrImagePull,
        ImagePullBackOff), as a kubelet leaves it; the watch tries it again (watch.py), its init
        containers too (no pod here has any that mind; a kubelet would not). Written, and logged,
        once per reason and message: each write is an event of the pod, and each event a try."""
        meta = sandbox.pod.metadata
        held = (meta.namespace, meta.name, reason, message)
        if self.state.held.get(meta.uid) == held:
            return
        self.state.held[meta.uid] = held
        log(f"{meta.namespace}/{meta.name} waits: {reason}: {message}")
        status = waiting_status(sandbox.pod, sandbox.ip, reason, message)
        patch_status(self.core, meta.name, meta.namespace, status=status)

    def fail_start(self, pod: Any, message: str) -> None:
        patch_status(self.core, pod.metadata.name, pod.metadata.namespace, status=start_error_status(pod, message))

    def finish(self, rec: PodProcess, code: int, *, deleted: bool = False) -> None:
        """The container ended for good: forget the pod (never start it again) and report how."""
        if not self.state.retire(rec.uid):
            return
        self.state.save()
        message = termination_message(rec, code)
        log(f"{rec.namespace}/{rec.name} exited {code}{' (deleted)' if deleted else ''}")
        patch_status(self.core, rec.name, rec.namespace, status=terminated_status(rec, code, message))

    def restart(self, rec: PodProcess) -> None:
        """Start the container again after a back-off; the pod keeps its IP and counts the restart."""
        with self.state.lock:
            self.state.running.pop(rec.uid, None)
        try:
            pod = self.core.read_namespaced_pod(rec.name, rec.namespace)
        except ApiException:
            return
        time.sleep(min(10, 2**rec.restarts) * 0.5)
        restarts = rec.restarts + 1
        with self.state.lock:
            self.start(pod)
            new = self.state.running.get(rec.uid)
            if new:
                new.restarts = restarts
                patch_status(self.core, new.name, new.namespace, status=running_status(new))
        self.state.save()

    def kill(self, rec: PodProcess, grace: float) -> int:
        """Stop the pod's container now; the exit reporter writes what follows."""
        return self.runtime.kill(rec, grace)

    def delete(self, rec: PodProcess, grace: float) -> None:
        """Graceful deletion: SIGTERM, up to `grace` seconds, SIGKILL; report the exit, remove the pod."""
        try:
            code = self.runtime.kill(rec, grace)
            self.finish(rec, code, deleted=True)
            remove_pod(self.core, rec.name, rec.namespace, uid=rec.uid)
        except Exception as exc:
            log(f"deleting {rec.namespace}/{rec.name}: {exc!r}")

    def nodes_gone(self, gone: set[str]) -> None:
        """The nodes whose Node objects are gone now: the pods of one newly lost die with its
        machine (SIGKILL, and no status: no kubelet is left to write one). A node back (its Node
        created again) reports those pods Failed, as a kubelet that comes back does."""
        with self.state.lock:
            lost, back = gone - self.state.lost_nodes, self.state.lost_nodes - gone
            self.state.lost_nodes = set(gone)
            dying = [rec for rec in self.state.running.values() if rec.node in lost]
            for rec in dying:
                self.state.retire(rec.uid)
                self.state.lost_pods.setdefault(rec.node, []).append(rec)
            self.state.save()
            ended = [rec for name in back for rec in self.state.lost_pods.pop(name, [])]
        for rec in dying:
            log(f"node {rec.node} is gone: {rec.namespace}/{rec.name} killed with it")
            self.runtime.kill(rec, grace=0)
        for rec in ended:  # a pod collected meanwhile is not written (404)
            patch_status(self.core, rec.name, rec.namespace, status=terminated_status(rec, 137, ""))

    def nodes_silent(self, silent: frozenset[str]) -> set[str]:
        """The nodes silenced now (nodes.py): the pods of one newly silent stop where they stand;
        those of one that answers again go on. The names of the nodes that came back."""
        with self.state.lock:
            hushed, woken = silent - self.state.silent_nodes, self.state.silent_nodes - silent
            self.state.silent_nodes = set(silent)
            stopping = [rec for rec in self.state.running.values() if rec.node in hushed]
        for rec in stopping:
            pids = freeze.processes(rec.pid, self.warm)
            freeze.signal_all(pids, signal.SIGSTOP)
            self.stopped.setdefault(rec.node, []).extend(pids)
            log(f"node {rec.node} is silent: {rec.namespace}/{rec.name} stopped (pids {pids})")
        for name in woken:  # the pids stopped, not a tree read now: a stopped rank's stand-in may be gone
            freeze.signal_all(self.stopped.pop(name, []), signal.SIGCONT)
            log(f"node {name} answers again: its processes go on")
        return woken

    def report_exits(self, stop: threading.Event) -> None:
        """The exit-reporting thread: restart or finish every pod whose container exited."""
        while not stop.wait(EXIT_POLL_SECONDS):
            for rec in list(self.state.running.values()):
                if rec.node in self.state.silent_nodes:
                    continue  # nobody is there to report it
                code = self.runtime.exited(rec)
                if code is None or rec.deleting:
                    continue  # a deleting pod is reported by its deletion thread
                try:
                    self._after_exit(rec, code)
                except Exception as exc:  # never let one pod stop exit reporting for all
                    log(f"{rec.namespace}/{rec.name}: reporting exit {code} failed: {exc!r}")

    def _after_exit(self, rec: PodProcess, code: int) -> None:
        if rec.restart_policy == "Always" or (rec.restart_policy == "OnFailure" and code != 0):
            self.restart(rec)
        else:
            self.finish(rec, code)


def _record(sandbox: PodSandbox, ctr: Any, started: Started) -> PodProcess:
    meta = sandbox.pod.metadata
    return PodProcess(
        uid=meta.uid,
        namespace=meta.namespace,
        name=meta.name,
        pid=started.pid,
        ip=sandbox.ip,
        pod_dir=str(sandbox.pod_dir),
        container=ctr.name,
        exit_file=str(started.exit_file),
        term_file=str(started.term_file),
        log_file=str(started.log_file),
        started_at=now(),
        restart_policy=sandbox.pod.spec.restart_policy or "Always",
        hosts=sandbox.hosts,
        mounts=started.mounts,
        node=sandbox.pod.spec.node_name or "",
    )
