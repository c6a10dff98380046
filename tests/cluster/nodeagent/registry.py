"""Image pulls as a kubelet makes them, against registries a test controls. The agent runs no
images, so every pull succeeds, except while the ConfigMap REGISTRY_FAULTS in the pod's own
namespace names the image's registry host (a key, without its port: a ConfigMap key has no
':') with the error that registry answers (its value): then the pull fails in the kubelet's
words, ErrImagePull the first time and ImagePullBackOff after (`pods.py` holds the pod and
tries it again). A test makes a registry fail, and answer again, by writing that ConfigMap;
another namespace's pulls never see it.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.rest import ApiException

#: The ConfigMap, in a pod's namespace, of the registry hosts whose pulls fail and how.
REGISTRY_FAULTS = "nodeagent-registry-faults"
PULLING, BACKING_OFF = "ErrImagePull", "ImagePullBackOff"
DEFAULT_REGISTRY = "docker.io"


class ImagePullFailed(Exception):
    """The image cannot be pulled now; its message is the kubelet's words for the pull."""


def registry_host(image: str) -> str:
    """The host of the registry an image reference names, without its port: its first part
    where that looks like a host (a '.' or ':' in it, or localhost), else Docker Hub, as the
    container runtime reads it."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first.partition(":")[0]
    return DEFAULT_REGISTRY


def pull(core: Any, namespace: str, image: str) -> None:
    """Pull `image` for a pod of `namespace`; raises ImagePullFailed while its registry fails."""
    try:
        faults = core.read_namespaced_config_map(REGISTRY_FAULTS, namespace).data or {}
    except ApiException as exc:
        if exc.status == 404:
            return
        raise
    error = faults.get(registry_host(image))
    if error is not None:
        raise ImagePullFailed(f'failed to pull and unpack image "{image}": {error}')


def waiting(error: ImagePullFailed, image: str, *, again: bool) -> tuple[str, str]:
    """The container's waiting reason and message: the pull's own error the first time, then the
    back-off's, which quotes it (as kubelets do since Kubernetes 1.31)."""
    if not again:
        return PULLING, str(error)
    return BACKING_OFF, f'Back-off pulling image "{image}": {PULLING}: {error}'
