"""What the agent writes to a pod's status, as kubelet would: Running with its IP, then
terminated with the exit code and termination message (Succeeded or Failed), Pending with
its container waiting (CreateContainerConfigError, ErrImagePull, ImagePullBackOff) while its
environment cannot be made or its image pulled, or
Failed with StartError when the pod could not be started at all.

Every write names the pod's one IP: podIPs is merged by ip, so a second address would make
every later status write invalid. That once happened silently and left finished pods
Running; a rejected write is now logged.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

from tests.cluster.nodeagent.log import log, now
from tests.cluster.nodeagent.state import PodProcess

MESSAGE_LIMIT = 1000
START_ERROR_CODE = 128
CONFIG_ERROR = "CreateContainerConfigError"


def patch_status(core: Any, name: str, namespace: str, *, status: dict[str, Any]) -> None:
    """Write a pod's status; a rejected write is logged, never silent."""
    try:
        core.patch_namespaced_pod_status(name, namespace, {"status": status})
    except ApiException as exc:
        if exc.status != 404:
            log(f"status of {namespace}/{name} not written: {exc.status} {str(exc.body)[:300]}")


def _container(rec: PodProcess, *, running: bool, state: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": rec.container,
        "image": "local",
        "imageID": "local://",
        "ready": running,
        "started": running,
        "restartCount": rec.restarts,
        "state": state,
    }


def running_status(rec: PodProcess) -> dict[str, Any]:
    """Running and Ready, on the pod's IP."""
    stamp = now()
    return {
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
        "containerStatuses": [_container(rec, running=True, state={"running": {"startedAt": rec.started_at}})],
    }


def terminated_status(rec: PodProcess, code: int, message: str) -> dict[str, Any]:
    """Succeeded on exit 0, else Failed; the container terminated with its code and message."""
    stamp = now()
    terminated: dict[str, Any] = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "startedAt": rec.started_at,
        "finishedAt": stamp,
    }
    if message:
        terminated["message"] = message
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "podIP": rec.ip,
        "podIPs": [{"ip": rec.ip}],
        "conditions": [
            {"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": stamp}
            for t in ("ContainersReady", "Ready")
        ],
        "containerStatuses": [_container(rec, running=False, state={"terminated": terminated})],
    }


def waiting_status(pod: Any, ip: str, reason: str, message: str) -> dict[str, Any]:
    """Pending on its IP, the main container waiting for `reason`, in the kubelet's words: its
    environment names a Secret or ConfigMap (or a key) that is not there, or its image cannot
    be pulled."""
    ctr, stamp = pod.spec.containers[0], now()
    waiting = {"reason": reason, "message": message[:MESSAGE_LIMIT]}
    return {
        "phase": "Pending",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "conditions": [
            {"type": t, "status": "False", "reason": "ContainersNotReady", "lastTransitionTime": stamp}
            for t in ("ContainersReady", "Ready")
        ],
        "containerStatuses": [
            {
                "name": ctr.name,
                "image": ctr.image or "",
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": waiting},
            }
        ],
    }


def start_error_status(pod: Any, message: str) -> dict[str, Any]:
    """Failed with StartError: the pod's main container never ran."""
    ctr = pod.spec.containers[0]
    message = message[:MESSAGE_LIMIT]
    terminated = {"exitCode": START_ERROR_CODE, "reason": "StartError", "message": message, "finishedAt": now()}
    return {
        "phase": "Failed",
        "message": message,
        "reason": "StartError",
        "containerStatuses": [
            {
                "name": ctr.name,
                "image": ctr.image or "",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": terminated},
            }
        ],
    }
