"""The test node agent: stands in for kubelet + a container runtime on the test cluster.

It registers two Nodes (a GPU node with NVIDIA GPU Feature Discovery's labels, capacity
`nvidia.com/gpu: 2` and the `nvidia.com/gpu=present:NoSchedule` taint, and a CPU node), keeps
their Leases and Ready conditions fresh, and runs every pod bound to them as local
processes: container command and args (no image), env (incl. fieldRef), volumes as local
directories (mount paths are rewritten to them in env values and args), a ServiceAccount
kubeconfig only when automountServiceAccountToken allows, a per-pod loopback IP with
`hostname.subdomain.namespace.svc` names in a marked /etc/hosts block, status with exit
codes and termination messages, and graceful deletion (SIGTERM, grace period, SIGKILL).

Each container runs under `/bin/sh -c 'trap true TERM INT; "$@"; echo $? > "$0"'` in its own
session, so the exit code survives an agent restart; the agent's state file lets a
restarted agent re-adopt running processes instead of orphaning them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from tests.cluster.controlplane import pid_alive as _pid_alive

HOSTS_FILE = Path(os.environ.get("MPJOB_AGENT_HOSTS_FILE", "/etc/hosts"))


def _markers(state_dir: Path) -> tuple[str, str]:
    """One /etc/hosts block per cluster state directory, so two test clusters coexist."""
    import hashlib

    tag = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8]
    return f"# BEGIN mpjob test cluster {tag}", f"# END mpjob test cluster {tag}"


PROVISIONER = "mpjob.dev/test-node-agent"
WRAPPER = 'trap true TERM INT; "$@"; echo $? > "$0"'

NODES: dict[str, dict[str, Any]] = {
    "gpu-node-0": {
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.count": "2",
        },
        "capacity": {"cpu": "16", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    },
    "cpu-node-0": {
        "labels": {},
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "taints": [],
    },
}


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log(msg: str) -> None:
    print(f"{now()} {msg}", flush=True)


@dataclass
class Running:
    uid: str
    namespace: str
    name: str
    pid: int
    ip: str
    pod_dir: str
    container: str
    exit_file: str
    term_file: str
    log_file: str
    started_at: str
    restart_policy: str = "Never"
    restarts: int = 0
    hosts: list[str] = field(default_factory=list)
    deleting: bool = False


def kill_recorded_pods(state_dir: Path) -> list[int]:
    """SIGKILL every process group the agent recorded (used by `down` as a last resort)."""
    state = state_dir / "agent" / "pods.json"
    killed = []
    try:
        records = json.loads(state.read_text())
    except (OSError, ValueError):
        return killed
    for rec in records.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec["pid"], signal.SIGKILL)
            killed.append(rec["pid"])
    state.unlink(missing_ok=True)
    _write_hosts(state_dir, {})
    return killed


def _write_hosts(state_dir: Path, entries: dict[str, list[str]]) -> None:
    """Replace the agent's block in /etc/hosts (written in place: it may be a bind mount)."""
    try:
        text = HOSTS_FILE.read_text()
    except OSError:
        return
    begin, end_mark = _markers(state_dir)
    lines = text.splitlines()
    if begin in lines and end_mark in lines:
        start, end = lines.index(begin), lines.index(end_mark)
        lines = lines[:start] + lines[end + 1 :]
    block = [line for lines_ in entries.values() for line in lines_]
    if block:
        lines += [begin, *block, end_mark]
    try:
        with HOSTS_FILE.open("w") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as exc:
        log(f"cannot write {HOSTS_FILE} ({exc.strerror}): pod DNS names will not resolve")


class NodeAgent:
    def __init__(self, kubeconfig: str, state_dir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.state_dir = state_dir
        self.agent_dir = state_dir / "agent"
        self.pods_dir = self.agent_dir / "pods"
        self.volumes_dir = state_dir / "volumes"
        self.logs_dir = state_dir / "logs" / "pods"
        for d in (self.agent_dir, self.pods_dir, self.volumes_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.state_file = self.agent_dir / "pods.json"
        self.lock = threading.RLock()
        self.running: dict[str, Running] = {}
        self.done: set[str] = set()  # pods whose container ended: never started again
        self.procs: dict[int, Any] = {}  # pid -> Popen for our own children
        self.hosts: dict[str, list[str]] = {}
        self.stop = threading.Event()
        self.server = self.api.configuration.host
        self.ca = self.api.configuration.ssl_ca_cert
        self._ip_counter = 0
        self._load_state()

    # ---------------------------------------------------------------- state
    def _load_state(self) -> None:
        try:
            records = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            records = {}
        for uid, rec in records.items():
            self.running[uid] = Running(**rec)
            self.hosts[uid] = rec.get("hosts", [])
        counter = self.agent_dir / "ip-counter"
        self._ip_counter = int(counter.read_text()) if counter.exists() else 0
        if self.running:
            log(f"re-adopting {len(self.running)} pod process(es)")

    def _save_state(self) -> None:
        # Written and renamed under the lock: threads saving at once once raced on the one temp
        # file, and the loser's rename killed the thread that reports pod exits.
        with self.lock:
            data = {uid: asdict(r) for uid, r in self.running.items()}
            tmp = self.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.state_file)

    def _next_ip(self) -> str:
        with self.lock:
            self._ip_counter += 1
            (self.agent_dir / "ip-counter").write_text(str(self._ip_counter))
            n = self._ip_counter
        return f"127.1.{(n // 250) % 250}.{n % 250 + 2}"

    # ---------------------------------------------------------------- nodes
    def register_nodes(self) -> None:
        for name, spec in NODES.items():
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        **spec["labels"],
                    },
                },
                "spec": {"taints": spec["taints"]},
            }
            try:
                self.core.create_node(body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self.core.patch_node(
                    name, {"metadata": {"labels": body["metadata"]["labels"]}, "spec": {"taints": spec["taints"]}}
                )
        self.heartbeat()

    def heartbeat(self) -> None:
        stamp = now()
        micro = datetime.now(UTC)
        for name, spec in NODES.items():
            status = {
                "capacity": spec["capacity"],
                "allocatable": spec["capacity"],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "test node agent",
                        "lastHeartbeatTime": stamp,
                        "lastTransitionTime": stamp,
                    },
                    *[
                        {
                            "type": t,
                            "status": "False",
                            "reason": "NoPressure",
                            "lastHeartbeatTime": stamp,
                            "lastTransitionTime": stamp,
                        }
                        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")
                    ],
                ],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "nodeInfo": {
                    "machineID": name,
                    "systemUUID": name,
                    "bootID": "test",
                    "kernelVersion": os.uname().release,
                    "osImage": "mpjob test node agent",
                    "containerRuntimeVersion": "local://0",
                    "kubeletVersion": "v1.34.4",
                    "kubeProxyVersion": "v1.34.4",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            }
            with contextlib.suppress(ApiException):
                self.core.patch_node_status(name, {"status": status})
            lease = {
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": micro},
            }
            try:
                self.coord.replace_namespaced_lease(name, "kube-node-lease", lease)
            except ApiException as exc:
                if exc.status == 404:
                    with contextlib.suppress(ApiException):
                        self.coord.create_namespaced_lease("kube-node-lease", lease)

    def _heartbeat_loop(self) -> None:
        while not self.stop.wait(8):
            try:
                self.heartbeat()
            except Exception as exc:
                log(f"heartbeat failed: {exc}")

    # ---------------------------------------------------------------- volumes
    def ensure_storage_class(self) -> None:
        storage = client.StorageV1Api(self.api)
        body = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }
        with contextlib.suppress(ApiException):
            storage.create_storage_class(body)

    def _provision_loop(self) -> None:
        """Stand-in provisioner: a Retain hostPath PV per pending claim, in .cluster/volumes."""
        while not self.stop.wait(0.5):
            try:
                for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
                    if pvc.spec.volume_name or (pvc.status and pvc.status.phase == "Bound"):
                        continue
                    ns, name = pvc.metadata.namespace, pvc.metadata.name
                    path = self.volumes_dir / ns / name
                    path.mkdir(parents=True, exist_ok=True)
                    size = ((pvc.spec.resources.requests or {}) if pvc.spec.resources else {}).get("storage", "1Gi")
                    pv = {
                        "apiVersion": "v1",
                        "kind": "PersistentVolume",
                        "metadata": {"name": f"pv-{pvc.metadata.uid}", "labels": {"mpjob.dev/test-volume": "true"}},
                        "spec": {
                            "capacity": {"storage": size},
                            "accessModes": pvc.spec.access_modes or ["ReadWriteOnce"],
                            "persistentVolumeReclaimPolicy": "Retain",
                            "storageClassName": pvc.spec.storage_class_name or "",
                            "hostPath": {"path": str(path)},
                            "claimRef": {"namespace": ns, "name": name, "uid": pvc.metadata.uid},
                        },
                    }
                    with contextlib.suppress(ApiException):
                        self.core.create_persistent_volume(pv)
            except Exception as exc:
                log(f"provisioner: {exc!r}")

    # ---------------------------------------------------------------- pods
    def _watch_loop(self) -> None:
        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    listing = self.core.list_pod_for_all_namespaces()
                    rv = listing.metadata.resource_version
                    seen = set()
                    for pod in listing.items:
                        seen.add(pod.metadata.uid)
                        self.reconcile(pod)
                    for uid in list(self.running):
                        if uid not in seen:
                            self._kill(self.running[uid], grace=0)
                w = watch.Watch()
                for event in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                ):
                    if self.stop.is_set():
                        return
                    obj = event["object"]
                    if event["type"] == "ERROR" or isinstance(obj, dict):
                        rv = None  # e.g. 410 Gone: list again
                        break
                    rv = obj.metadata.resource_version
                    if event["type"] == "DELETED":
                        rec = self.running.get(obj.metadata.uid)
                        if rec:
                            self._kill(rec, grace=0)
                    elif event["type"] != "BOOKMARK":
                        self.reconcile(obj)
            except ApiException as exc:
                if exc.status == 410:
                    rv = None
                else:
                    log(f"watch error: {exc.status} {exc.reason}")
                    time.sleep(1)
            except Exception as exc:
                log(f"watch error: {exc!r}")
                rv = None
                time.sleep(1)

    def reconcile(self, pod: Any) -> None:
        if pod.spec.node_name not in NODES:
            return
        uid = pod.metadata.uid
        if pod.metadata.deletion_timestamp:
            rec = self.running.get(uid)
            if rec and not rec.deleting:
                rec.deleting = True
                grace = pod.metadata.deletion_grace_period_seconds
                if grace is None:
                    grace = pod.spec.termination_grace_period_seconds or 30
                threading.Thread(target=self._delete, args=(rec, pod, grace), daemon=True).start()
            elif not rec and not (pod.metadata.finalizers or []):
                with contextlib.suppress(ApiException):
                    self.core.delete_namespaced_pod(
                        pod.metadata.name,
                        pod.metadata.namespace,
                        grace_period_seconds=0,
                        body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": uid}),
                    )
            return
        if uid in self.running or uid in self.done or (pod.status and pod.status.phase in ("Succeeded", "Failed")):
            return
        with self.lock:
            if uid in self.running or uid in self.done:
                return
            try:
                self._start(pod)
            except Exception as exc:
                log(f"pod {pod.metadata.namespace}/{pod.metadata.name} failed to start: {exc!r}")
                self._fail_start(pod, str(exc))

    # -- starting --------------------------------------------------------------------
    def _volume_dirs(self, pod: Any, pod_dir: Path) -> dict[str, Path]:
        dirs: dict[str, Path] = {}
        for vol in pod.spec.volumes or []:
            if vol.persistent_volume_claim:
                d = self.volumes_dir / pod.metadata.namespace / vol.persistent_volume_claim.claim_name
            elif vol.config_map:
                d = pod_dir / "volumes" / vol.name
                d.mkdir(parents=True, exist_ok=True)
                cm = self.core.read_namespaced_config_map(vol.config_map.name, pod.metadata.namespace)
                for key, value in (cm.data or {}).items():
                    (d / key).write_text(value)
            elif vol.secret:
                import base64

                d = pod_dir / "volumes" / vol.name
                d.mkdir(parents=True, exist_ok=True)
                secret = self.core.read_namespaced_secret(vol.secret.secret_name, pod.metadata.namespace)
                for key, value in (secret.data or {}).items():
                    (d / key).write_bytes(base64.b64decode(value))
            elif vol.downward_api:
                d = pod_dir / "volumes" / vol.name
                d.mkdir(parents=True, exist_ok=True)
                for item in vol.downward_api.items or []:
                    if item.field_ref:
                        (d / item.path).write_text(str(self._field(pod, item.field_ref.field_path, "")))
            else:  # emptyDir and anything else: a per-pod directory
                d = pod_dir / "volumes" / vol.name
            d.mkdir(parents=True, exist_ok=True)
            dirs[vol.name] = d
        return dirs

    @staticmethod
    def _field(pod: Any, path: str, ip: str) -> str:
        meta = pod.metadata
        if path.startswith("metadata.labels['"):
            return str((meta.labels or {}).get(path[len("metadata.labels['") : -2], ""))
        if path.startswith("metadata.annotations['"):
            return str((meta.annotations or {}).get(path[len("metadata.annotations['") : -2], ""))
        return str(
            {
                "metadata.name": meta.name,
                "metadata.namespace": meta.namespace,
                "metadata.uid": meta.uid,
                "spec.nodeName": pod.spec.node_name,
                "spec.serviceAccountName": pod.spec.service_account_name,
                "status.podIP": ip,
                "status.hostIP": "127.0.0.1",
            }.get(path, "")
        )

    def _credentials(self, pod: Any, pod_dir: Path) -> str | None:
        """A kubeconfig with a bound token, only when automountServiceAccountToken allows."""
        sa_name = pod.spec.service_account_name or "default"
        automount = pod.spec.automount_service_account_token
        if automount is None:
            try:
                sa = self.core.read_namespaced_service_account(sa_name, pod.metadata.namespace)
                automount = sa.automount_service_account_token
            except ApiException:
                automount = None
        if automount is False:
            return None
        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc.cluster.local"],
                expiration_seconds=7200,
                bound_object_ref=client.V1BoundObjectReference(
                    kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        token = self.core.create_namespaced_service_account_token(sa_name, pod.metadata.namespace, request).status.token
        path = pod_dir / "kubeconfig"
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "sa",
                    "clusters": [{"name": "c", "cluster": {"server": self.server, "certificate-authority": self.ca}}],
                    "users": [{"name": "sa", "user": {"token": token}}],
                    "contexts": [
                        {"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": pod.metadata.namespace}}
                    ],
                }
            )
        )
        path.chmod(0o600)
        return str(path)

    def _start(self, pod: Any) -> None:
        import subprocess

        meta = pod.metadata
        uid = meta.uid
        pod_dir = self.pods_dir / uid
        pod_dir.mkdir(parents=True, exist_ok=True)
        # A pod keeps its IP for life (as with kubelet): podIPs is merged by ip, so a second
        # address would make every later status patch invalid (one IP per family).
        ip = (pod.status.pod_ip if pod.status else None) or self._next_ip()
        vols = self._volume_dirs(pod, pod_dir)
        kubeconfig = self._credentials(pod, pod_dir)
        hosts = []
        if pod.spec.hostname and pod.spec.subdomain:
            fqdn = f"{pod.spec.hostname}.{pod.spec.subdomain}.{meta.namespace}.svc"
            hosts.append(f"{ip} {fqdn} {fqdn}.cluster.local")
        with self.lock:
            self.hosts[uid] = hosts
            _write_hosts(self.state_dir, self.hosts)
        containers = [*list(pod.spec.init_containers or []), pod.spec.containers[0]]
        for i, ctr in enumerate(containers):
            is_main = i == len(containers) - 1
            mounts = {
                m.mount_path: vols[m.name] / (m.sub_path or "") for m in (ctr.volume_mounts or []) if m.name in vols
            }
            term_path = ctr.termination_message_path or "/dev/termination-log"
            term_file = pod_dir / f"termination-{ctr.name}"
            term_file.write_text("")
            rewrites = sorted({**mounts, term_path: term_file}.items(), key=lambda kv: -len(kv[0]))

            def rewrite(value: str, rewrites: list[tuple[str, Path]] = rewrites) -> str:
                for src, dst in rewrites:
                    if src and src in value:
                        value = value.replace(src, str(dst))
                return value

            env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "MPJOB_CLUSTER"))}
            env.pop("VIRTUAL_ENV_PROMPT", None)
            env.update(
                {
                    "HOSTNAME": pod.spec.hostname or meta.name,
                    "POD_IP": ip,
                    "MPJOB_TERMINATION_LOG": str(term_file),
                    "HOME": str(pod_dir),
                }
            )
            for var in ctr.env or []:
                if var.value is not None:
                    env[var.name] = rewrite(var.value)
                elif var.value_from and var.value_from.field_ref:
                    env[var.name] = self._field(pod, var.value_from.field_ref.field_path, ip)
                elif var.value_from and var.value_from.config_map_key_ref:
                    ref = var.value_from.config_map_key_ref
                    env[var.name] = (self.core.read_namespaced_config_map(ref.name, meta.namespace).data or {})[ref.key]
                elif var.value_from and var.value_from.secret_key_ref:
                    import base64

                    ref = var.value_from.secret_key_ref
                    data = self.core.read_namespaced_secret(ref.name, meta.namespace).data or {}
                    env[var.name] = base64.b64decode(data[ref.key]).decode()
            if kubeconfig:
                env["KUBECONFIG"] = kubeconfig
            argv = [rewrite(a) for a in (ctr.command or []) + (ctr.args or [])]
            if not argv:
                raise RuntimeError(f"container {ctr.name} has no command: the test node agent runs no images")
            workdir = Path(rewrite(ctr.working_dir)) if ctr.working_dir else pod_dir
            if ctr.working_dir and not workdir.is_absolute():
                workdir = pod_dir / workdir
            if ctr.working_dir and str(workdir) == ctr.working_dir:
                workdir = pod_dir / ctr.working_dir.lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
            log_file = self.logs_dir / f"{meta.namespace}_{meta.name}_{ctr.name}.log"
            exit_file = pod_dir / f"exit-{ctr.name}"
            exit_file.unlink(missing_ok=True)
            out = log_file.open("ab")
            proc = subprocess.Popen(
                ["/bin/sh", "-c", WRAPPER, str(exit_file), *argv],
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            out.close()
            if not is_main:
                code = proc.wait()
                if code != 0 or self._exit_code(exit_file) != 0:
                    raise RuntimeError(f"init container {ctr.name} exited {self._exit_code(exit_file)}")
                continue
            self.procs[proc.pid] = proc
            rec = Running(
                uid=uid,
                namespace=meta.namespace,
                name=meta.name,
                pid=proc.pid,
                ip=ip,
                pod_dir=str(pod_dir),
                container=ctr.name,
                exit_file=str(exit_file),
                term_file=str(term_file),
                log_file=str(log_file),
                started_at=now(),
                restart_policy=pod.spec.restart_policy or "Always",
                hosts=hosts,
            )
            self.running[uid] = rec
            self._save_state()
            log(f"started {meta.namespace}/{meta.name} pid {proc.pid} ip {ip}: {argv[:4]}")
            self._write_running(rec)

    def _fail_start(self, pod: Any, message: str) -> None:
        ctr = pod.spec.containers[0].name
        self._patch_status(
            pod.metadata.name,
            pod.metadata.namespace,
            {
                "status": {
                    "phase": "Failed",
                    "message": message[:1000],
                    "reason": "StartError",
                    "containerStatuses": [
                        {
                            "name": ctr,
                            "image": pod.spec.containers[0].image or "",
                            "imageID": "",
                            "ready": False,
                            "restartCount": 0,
                            "state": {
                                "terminated": {
                                    "exitCode": 128,
                                    "reason": "StartError",
                                    "message": message[:1000],
                                    "finishedAt": now(),
                                }
                            },
                        }
                    ],
                }
            },
        )

    def _patch_status(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        """Write a pod's status; a rejected write is logged, never silent."""
        try:
            self.core.patch_namespaced_pod_status(name, namespace, body)
        except ApiException as exc:
            if exc.status != 404:
                log(f"status of {namespace}/{name} not written: {exc.status} {str(exc.body)[:300]}")

    def _write_running(self, rec: Running) -> None:
        stamp = now()
        status = {
            "phase": "Running",
            "podIP": rec.ip,
            "podIPs": [{"ip": rec.ip}],
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "startTime": rec.started_at,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": stamp}
                for t in ("Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers")
            ],
            "containerStatuses": [
                {
                    "name": rec.container,
                    "image": "local",
                    "imageID": "local://",
                    "ready": True,
                    "started": True,
                    "restartCount": rec.restarts,
                    "state": {"running": {"startedAt": rec.started_at}},
                }
            ],
        }
        self._patch_status(rec.name, rec.namespace, {"status": status})

    # -- running and ending ----------------------------------------------------------
    @staticmethod
    def _exit_code(exit_file: Path | str) -> int | None:
        try:
            return int(Path(exit_file).read_text().strip())
        except (OSError, ValueError):
            return None

    def _exited(self, rec: Running) -> int | None:
        proc = self.procs.get(rec.pid)
        if proc is not None:
            if proc.poll() is None:
                return None
            self.procs.pop(rec.pid, None)
        elif _pid_alive(rec.pid):
            return None
        code = self._exit_code(rec.exit_file)
        return 137 if code is None else code

    def _monitor_loop(self) -> None:
        while not self.stop.wait(0.2):
            for rec in list(self.running.values()):
                code = self._exited(rec)
                if code is None:
                    continue
                if rec.deleting:
                    continue  # the deleting thread reports it
                try:
                    if rec.restart_policy == "Always" or (rec.restart_policy == "OnFailure" and code != 0):
                        self._restart(rec, code)
                    else:
                        self._finish(rec, code)
                except Exception as exc:  # never let one pod stop exit reporting for all
                    log(f"{rec.namespace}/{rec.name}: reporting exit {code} failed: {exc!r}")

    def _termination_message(self, rec: Running, code: int, pod: Any | None = None) -> str:
        try:
            text = Path(rec.term_file).read_bytes()[:4096].decode(errors="replace")
        except OSError:
            text = ""
        if not text and code != 0:
            try:  # FallbackToLogsOnError-style: the tail of the log
                tail = Path(rec.log_file).read_bytes()[-2048:].decode(errors="replace")
                text = "\n".join(tail.splitlines()[-20:])
            except OSError:
                pass
        return text

    def _finish(self, rec: Running, code: int, deleted: bool = False) -> None:
        with self.lock:
            if self.running.pop(rec.uid, None) is None:
                return
            self.done.add(rec.uid)
            self.hosts.pop(rec.uid, None)
            _write_hosts(self.state_dir, self.hosts)
        self._save_state()
        stamp = now()
        message = self._termination_message(rec, code)
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": rec.started_at,
            "finishedAt": stamp,
        }
        if message:
            terminated["message"] = message
        phase = "Succeeded" if code == 0 else "Failed"
        status = {
            "phase": phase,
            "podIP": rec.ip,
            "podIPs": [{"ip": rec.ip}],
            "conditions": [
                {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
                for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": rec.container,
                    "image": "local",
                    "imageID": "local://",
                    "ready": False,
                    "started": False,
                    "restartCount": rec.restarts,
                    "state": {"terminated": terminated},
                }
            ],
        }
        log(f"{rec.namespace}/{rec.name} exited {code}{' (deleted)' if deleted else ''}")
        self._patch_status(rec.name, rec.namespace, {"status": status})

    def _restart(self, rec: Running, code: int) -> None:
        with self.lock:
            self.running.pop(rec.uid, None)
        try:
            pod = self.core.read_namespaced_pod(rec.name, rec.namespace)
        except ApiException:
            return
        time.sleep(min(10, 2**rec.restarts) * 0.5)
        restarts = rec.restarts + 1
        with self.lock:
            self._start(pod)
            new = self.running.get(rec.uid)
            if new:
                new.restarts = restarts
                self._write_running(new)
        self._save_state()

    def _kill(self, rec: Running, grace: float) -> int:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            code = self._exited(rec)
            if code is not None:
                return code
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec.pid, signal.SIGKILL)
        for _ in range(50):
            code = self._exited(rec)
            if code is not None:
                return code
            time.sleep(0.1)
        return 137

    def _delete(self, rec: Running, pod: Any, grace: float) -> None:
        try:
            code = self._kill(rec, grace)
            self._finish(rec, code, deleted=True)
            self.core.delete_namespaced_pod(
                rec.name,
                rec.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": rec.uid}),
            )
        except Exception as exc:
            log(f"deleting {rec.namespace}/{rec.name}: {exc!r}")

    # ---------------------------------------------------------------- lifecycle
    def run(self) -> None:
        self.register_nodes()
        self.ensure_storage_class()
        with self.lock:
            _write_hosts(self.state_dir, self.hosts)
        threads = [
            threading.Thread(target=t, daemon=True)
            for t in (self._heartbeat_loop, self._watch_loop, self._monitor_loop, self._provision_loop)
        ]
        for t in threads:
            t.start()
        log("node agent running")
        self.stop.wait()

    def shutdown(self) -> None:
        """Stop every pod process (the cluster is going away) and the hosts block."""
        self.stop.set()
        for rec in list(self.running.values()):
            self._kill(rec, grace=5)
        self.running.clear()
        self._save_state()
        _write_hosts(self.state_dir, {})


def main() -> None:
    parser = argparse.ArgumentParser(description="test node agent")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    args = parser.parse_args()
    agent = NodeAgent(args.kubeconfig, args.state_dir)
    # SIGTERM (make cluster-down) stops the pods; SIGKILL leaves them for a restarted agent.
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    while not agent.stop.wait(1):
        pass
    agent.shutdown()
    log("node agent stopped")


if __name__ == "__main__":
    main()
