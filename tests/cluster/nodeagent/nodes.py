"""The Nodes the agent stands in for, and what keeps them schedulable.

A GPU node with NVIDIA GPU Feature Discovery's labels, capacity `nvidia.com/gpu: 8` and the
`nvidia.com/gpu=present:NoSchedule` taint (so GPU scheduling, affinity and tolerations are
exercised for real), and a CPU node. A second GPU node, the same but for its label and taint
`mpjob.dev/test-node=own`, holds only the pods of tests that count its GPUs (elastic jobs that
shrink to what fits and grow when a GPU frees): the tests beside them, in other workers and in
the e2e process, take GPUs of the first one and never land there (EXCLUSIVE_PLACEMENT). Every 8
s their Ready conditions and their Leases in `kube-node-lease` are renewed: without that the
node lifecycle controller would taint them unreachable and evict the pods.

A test that needs more GPUs on a GPU node (an elastic job growing under a raised Kueue quota)
annotates it `mpjob.dev/test-gpus: "<n>"`; the heartbeat reports that capacity until the
annotation goes.
"""

from __future__ import annotations

import contextlib
import os
import threading
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.log import log, now

NODES: dict[str, dict[str, Any]] = {
    "gpu-node-0": {
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.count": "8",
        },
        "capacity": {"cpu": "16", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "8"},
        "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
    },
    "gpu-node-own": {
        "labels": {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.count": "2",
            "mpjob.dev/test-node": "own",
        },
        "capacity": {"cpu": "16", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": "2"},
        "taints": [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
            {"key": "mpjob.dev/test-node", "value": "own", "effect": "NoSchedule"},
        ],
    },
    "cpu-node-0": {
        "labels": {},
        "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        "taints": [],
    },
}
#: A pod template's placement on the GPU node of its own (spec.template of a MixedPrecisionJob).
EXCLUSIVE_PLACEMENT: dict[str, Any] = {
    "nodeSelector": {"mpjob.dev/test-node": "own"},
    "tolerations": [{"key": "mpjob.dev/test-node", "operator": "Equal", "value": "own", "effect": "NoSchedule"}],
}
HEARTBEAT_SECONDS = 8
GPUS_ANNOTATION = "mpjob.dev/test-gpus"
PRESSURES = ("MemoryPressure", "DiskPressure", "PIDPressure")
LEASE_SECONDS = 40


def register_nodes(core: Any, coord: Any) -> None:
    """Create the Nodes (or bring an existing one's labels and taints up to date), then beat once."""
    for name, spec in NODES.items():
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **spec["labels"],
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "spec": {"taints": spec["taints"]},
        }
        try:
            core.create_node(body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.patch_node(name, {"metadata": {"labels": labels}, "spec": {"taints": spec["taints"]}})
    heartbeat(core, coord)


def heartbeat(core: Any, coord: Any) -> None:
    """Report every node Ready (with capacity and node info) and renew its Lease."""
    stamp = now()
    renew_time = datetime.now(UTC)
    for name, spec in NODES.items():
        with contextlib.suppress(ApiException):
            capacity = _capacity(core, name, spec["capacity"])
            core.patch_node_status(name, {"status": node_status(name, capacity, stamp)})
        _renew_lease(coord, name, renew_time)


def _capacity(core: Any, name: str, capacity: dict[str, str]) -> dict[str, str]:
    """The node's capacity, its GPUs as a test's annotation says (GPUS_ANNOTATION) when it has one."""
    if "nvidia.com/gpu" not in capacity:
        return capacity
    gpus = (core.read_node(name).metadata.annotations or {}).get(GPUS_ANNOTATION)
    return {**capacity, "nvidia.com/gpu": gpus} if gpus and gpus.isdigit() else capacity


def keep_alive(core: Any, coord: Any, stop: threading.Event) -> None:
    """The heartbeat thread: a failed beat is logged and the next one tries again."""
    while not stop.wait(HEARTBEAT_SECONDS):
        try:
            heartbeat(core, coord)
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
    try:
        coord.replace_namespaced_lease(name, "kube-node-lease", lease)
    except ApiException as exc:
        if exc.status == 404:
            with contextlib.suppress(ApiException):
                coord.create_namespaced_lease("kube-node-lease", lease)
