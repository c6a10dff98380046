"""The Nodes the agent stands in for, and what keeps them schedulable.

A GPU node with NVIDIA GPU Feature Discovery's labels, capacity `nvidia.com/gpu: 8` and the
`nvidia.com/gpu=present:NoSchedule` taint (so GPU scheduling, affinity and tolerations are
exercised for real), and a CPU node. More GPU nodes, the same but for a pool's label and taint
(`mpjob.dev/test-node=<pool>`), hold only the pods of the tests that count their GPUs or remove
them (elastic jobs that shrink to what fits and grow when a GPU or a node returns): the tests
beside them, in other workers and in the e2e process, take GPUs of the first one and never land
there (`placement(pool)`). Every 8 s their Ready conditions and their Leases in
`kube-node-lease` are renewed: without that the node lifecycle controller would taint them
unreachable and evict the pods.

A node whose Node object is deleted (a machine gone: `remove_node`) is lost: the heartbeat
that finds it missing kills its pods' processes at once and writes nothing more about them (no
kubelet is left to); Kubernetes' pod garbage collector deletes them later. Created again
(`return_node`, as a returning kubelet registers), it is beaten Ready again and takes new pods.

A node a test silences (`silence_node`: the annotation `mpjob.dev/test-silent`) has stopped
answering, as a hung or cut-off machine does: its Ready condition and Lease are no longer renewed
(the node lifecycle controller marks it Unknown and taints it `node.kubernetes.io/unreachable`
once its grace period passes), its pods' processes are stopped where they stand, and nothing of
its pods is written or acted on. Woken (`wake_node`), it is beaten Ready again, its processes
go on, and its pods' pending deletions are carried out, as a kubelet that comes back does.

A test that needs more GPUs on a GPU node (an elastic job growing under a raised Kueue quota)
annotates it `mpjob.dev/test-gpus: "<n>"`; the heartbeat reports that capacity until the
annotation goes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.log import log, now

POOL_LABEL = "mpjob.dev/test-node"


def _gpu_node(gpus: int, pool: str | None = None) -> dict[str, Any]:
    """An H100 node of `gpus` GPUs; in a `pool`, labelled and tainted so that only pods placed
    there (`placement(pool)`) land on it."""
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": str(gpus),
    }
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    if pool is not None:
        labels[POOL_LABEL] = pool
        taints.append({"key": POOL_LABEL, "value": pool, "effect": "NoSchedule"})
    capacity = {"cpu": "16", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"labels": labels, "capacity": capacity, "taints": taints}


def placement(pool: str) -> dict[str, Any]:
    """A pod template's placement on the GPU nodes of `pool` (spec.template of a MixedPrecisionJob)."""
    return {
        "nodeSelector": {POOL_LABEL: pool},
        "tolerations": [{"key": POOL_LABEL, "operator": "Equal", "value": pool, "effect": "NoSchedule"}],
    }


#: The shared GPU node; a node of its own for the elastic tests that count its GPUs (`own`), one
#: for the elastic job in a Kueue queue, which raises its count (`quota`); three nodes of one GPU
#: each for the tests that remove a node and bring it back (`trio`).
NODES: dict[str, dict[str, Any]] = {
    "gpu-node-0": _gpu_node(8),
    "gpu-node-own": _gpu_node(2, "own"),
    "gpu-node-quota": _gpu_node(2, "quota"),
    **{f"gpu-node-trio-{k}": _gpu_node(1, "trio") for k in range(3)},
    "cpu-node-0": {"labels": {}, "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"}, "taints": []},
}
EXCLUSIVE_PLACEMENT = placement("own")
HEARTBEAT_SECONDS = 8
GPUS_ANNOTATION = "mpjob.dev/test-gpus"
SILENT_ANNOTATION = "mpjob.dev/test-silent"
PRESSURES = ("MemoryPressure", "DiskPressure", "PIDPressure")
LEASE_SECONDS = 40


def register_nodes(core: Any, coord: Any) -> None:
    """Create the Nodes (or bring an existing one's labels and taints up to date), then beat once."""
    for name in NODES:
        body = node_body(name)
        try:
            core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.patch_node(name, {"metadata": {"labels": body["metadata"]["labels"]}, "spec": body["spec"]})
    heartbeat(core, coord)


def node_body(name: str) -> dict[str, Any]:
    """The Node the agent registers for `name` (labels and taints as NODES has them)."""
    spec = NODES[name]
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {**labels, **spec["labels"]}},
        "spec": {"taints": spec["taints"]},
    }


def remove_node(core: Any, name: str) -> None:
    """The machine `name` is gone: its Node object is deleted, as a cloud's node controller does."""
    core.delete_node(name)


def return_node(core: Any, name: str) -> None:
    """The machine `name` is back: its Node registered again (the next heartbeat makes it Ready)."""
    core.create_node(node_body(name))


def silence_node(core: Any, name: str) -> None:
    """The machine `name` stops answering (module doc), from the agent's next heartbeat on."""
    core.patch_node(name, {"metadata": {"annotations": {SILENT_ANNOTATION: "true"}}})


def wake_node(core: Any, name: str) -> None:
    """The machine `name` answers again, from the agent's next heartbeat on."""
    core.patch_node(name, {"metadata": {"annotations": {SILENT_ANNOTATION: None}}})


@dataclass(frozen=True)
class Beat:
    """What one heartbeat found: the nodes whose Node object is gone, and those silenced."""

    gone: frozenset[str]
    silent: frozenset[str]


def heartbeat(core: Any, coord: Any) -> Beat:
    """Report every node Ready (with capacity and node info) and renew its Lease, but for the
    nodes gone (deleted) and those silenced, which are not beaten."""
    stamp = now()
    renew_time = datetime.now(UTC)
    gone: set[str] = set()
    silent: set[str] = set()
    for name, spec in NODES.items():
        try:
            annotations = core.read_node(name).metadata.annotations or {}
            if annotations.get(SILENT_ANNOTATION):
                silent.add(name)
                continue
            capacity = _capacity(annotations, spec["capacity"])
            core.patch_node_status(name, {"status": node_status(name, capacity, stamp)})
        except ApiException as exc:
            if exc.status == 404:
                gone.add(name)
                continue
        _renew_lease(coord, name, renew_time)
    return Beat(frozenset(gone), frozenset(silent))


def _capacity(annotations: dict[str, str], capacity: dict[str, str]) -> dict[str, str]:
    """The node's capacity, its GPUs as a test's annotation says (GPUS_ANNOTATION) when it has one."""
    if "nvidia.com/gpu" not in capacity:
        return capacity
    gpus = annotations.get(GPUS_ANNOTATION)
    return {**capacity, "nvidia.com/gpu": gpus} if gpus and gpus.isdigit() else capacity


def keep_alive(core: Any, coord: Any, stop: threading.Event, heard: Callable[[Beat], None]) -> None:
    """The heartbeat thread: `heard` hears what each beat found; a failed beat is logged and the
    next one tries again."""
    while not stop.wait(HEARTBEAT_SECONDS):
        try:
            heard(heartbeat(core, coord))
        except Exception as exc:
            log(f"heartbeat failed: {exc}")


def _condition(kind: str, status: str, reason: str, *, stamp: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }


def node_status(name: str, capacity: dict[str, str], stamp: str) -> dict[str, Any]:
    """A kubelet's node status: Ready, no pressure, all capacity allocatable."""
    ready = {**_condition("Ready", "True", "KubeletReady", stamp=stamp), "message": "test node agent"}
    pressure = [_condition(t, "False", "NoPressure", stamp=stamp) for t in PRESSURES]
    return {
        "capacity": capacity,
        "allocatable": capacity,
        "conditions": [ready, *pressure],
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


def _renew_lease(coord: Any, name: str, renew_time: datetime) -> None:
    lease = {
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew_time},
    }
    try:  # a merge patch: a replace would need the Lease's resourceVersion (422 without it)
        coord.patch_namespaced_lease(name, "kube-node-lease", {"spec": lease["spec"]})
    except ApiException as exc:
        if exc.status != 404:
            log(f"renewing the Lease of {name} failed: {exc.status} {exc.reason}")
            return
        with contextlib.suppress(ApiException):
            coord.create_namespaced_lease("kube-node-lease", lease)
