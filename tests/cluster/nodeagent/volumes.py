"""Volumes as local directories: no mounts, only paths the agent rewrites.

A PersistentVolumeClaim is bound to a Retain hostPath PersistentVolume that the agent
provisions in `<state>/volumes/<namespace>/<claim>` (the default StorageClass `standard`
names the agent as its provisioner), so a checkpoint outlives its pod the way it would on a
cluster. emptyDir (and any kind the agent does not know) is a per-pod directory;
configMap, secret and downwardAPI volumes are per-pod directories filled with their keys.
"""

from __future__ import annotations

import base64
import contextlib
import threading
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.downward import field_value
from tests.cluster.nodeagent.log import log

PROVISIONER = "mpjob.dev/test-node-agent"


def ensure_storage_class(api: Any) -> None:
    """The default StorageClass, provisioned by this agent (kept if it exists)."""
    body: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "standard", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Retain",
        "volumeBindingMode": "Immediate",
    }
    storage: Any = client.StorageV1Api(api)
    with contextlib.suppress(ApiException):
        storage.create_storage_class(body)


def provision_claims(core: Any, volumes_dir: Path, stop: threading.Event) -> None:
    """The stand-in provisioner's thread: a PersistentVolume for every unbound claim, as a watch
    of the claims shows them (listed again when a watch ends, every minute, or fails)."""
    claims = core.list_persistent_volume_claim_for_all_namespaces
    while not stop.is_set():
        try:
            listing = claims()
            for pvc in listing.items:
                provide(core, volumes_dir, pvc)
            version = listing.metadata.resource_version
            for event in watch.Watch().stream(claims, resource_version=version, timeout_seconds=60):
                if stop.is_set():
                    return
                if event["type"] in ("ADDED", "MODIFIED"):
                    provide(core, volumes_dir, event["object"])
        except Exception as exc:
            log(f"provisioner: {exc!r}")
            stop.wait(1)


def provide(core: Any, volumes_dir: Path, pvc: Any) -> None:
    """A volume directory and a PersistentVolume bound to `pvc`, unless it is bound already."""
    if pvc.spec.volume_name or (pvc.status and pvc.status.phase == "Bound"):
        return
    path = volumes_dir / pvc.metadata.namespace / pvc.metadata.name
    path.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(ApiException):  # 409: made by an earlier event or listing
        core.create_persistent_volume(persistent_volume(pvc, path))


def persistent_volume(pvc: Any, path: Path) -> dict[str, Any]:
    """A Retain hostPath PV at `path`, pre-bound to the claim."""
    size = ((pvc.spec.resources.requests or {}) if pvc.spec.resources else {}).get("storage", "1Gi")
    meta = pvc.metadata
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{meta.uid}", "labels": {"mpjob.dev/test-volume": "true"}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": pvc.spec.access_modes or ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": pvc.spec.storage_class_name or "",
            "hostPath": {"path": str(path)},
            "claimRef": {"namespace": meta.namespace, "name": meta.name, "uid": meta.uid},
        },
    }


def volume_dirs(core: Any, pod: Any, *, pod_dir: Path, volumes_dir: Path) -> dict[str, Path]:
    """Each of the pod's volumes as a directory (created, and filled for configMap/secret/downwardAPI)."""
    dirs: dict[str, Path] = {}
    for vol in pod.spec.volumes or []:
        if vol.persistent_volume_claim:
            d = volumes_dir / pod.metadata.namespace / vol.persistent_volume_claim.claim_name
        else:  # emptyDir and anything else: a per-pod directory
            d = pod_dir / "volumes" / vol.name
            _fill(core, pod, vol, into=d)
        d.mkdir(parents=True, exist_ok=True)
        dirs[vol.name] = d
    return dirs


def _fill(core: Any, pod: Any, vol: Any, *, into: Path) -> None:
    """Write a configMap's, secret's or downwardAPI volume's files into its directory."""
    namespace = pod.metadata.namespace
    if vol.config_map:
        into.mkdir(parents=True, exist_ok=True)
        cm = core.read_namespaced_config_map(vol.config_map.name, namespace)
        for key, value in (cm.data or {}).items():
            (into / key).write_text(value)
    elif vol.secret:
        into.mkdir(parents=True, exist_ok=True)
        secret = core.read_namespaced_secret(vol.secret.secret_name, namespace)
        for key, value in (secret.data or {}).items():
            (into / key).write_bytes(base64.b64decode(value))
    elif vol.downward_api:
        into.mkdir(parents=True, exist_ok=True)
        for item in vol.downward_api.items or []:
            if item.field_ref:
                (into / item.path).write_text(str(field_value(pod, item.field_ref.field_path, "")))
