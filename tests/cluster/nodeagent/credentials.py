"""A pod's ServiceAccount credentials, as kubelet would mount them, but as a kubeconfig.

Only when automountServiceAccountToken allows (the pod's field, else its ServiceAccount's):
the operator's attempt pods opt out, and tests prove that a pod without the token gets no
KUBECONFIG at all. The token is a bound one (TokenRequest, tied to the pod's UID), so it
dies with the pod and RBAC sees the pod's ServiceAccount.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

AUDIENCE = "https://kubernetes.default.svc.cluster.local"


def service_account_kubeconfig(core: Any, pod: Any, *, pod_dir: Path, server: str, ca: str) -> str | None:
    """The path of a kubeconfig with a bound token for the pod, or None when it must have none."""
    sa_name = pod.spec.service_account_name or "default"
    if _automount(core, pod, sa_name) is False:
        return None
    token = _bound_token(core, pod, sa_name)
    namespace = pod.metadata.namespace
    path = pod_dir / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "sa",
                "clusters": [{"name": "c", "cluster": {"server": server, "certificate-authority": ca}}],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": namespace}}],
            }
        )
    )
    path.chmod(0o600)
    return str(path)


def _automount(core: Any, pod: Any, sa_name: str) -> bool | None:
    automount = pod.spec.automount_service_account_token
    if automount is not None:
        return bool(automount)
    try:
        return core.read_namespaced_service_account(sa_name, pod.metadata.namespace).automount_service_account_token
    except ApiException:
        return None


def _bound_token(core: Any, pod: Any, sa_name: str) -> str:
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[AUDIENCE],
            expiration_seconds=7200,
            bound_object_ref=client.V1BoundObjectReference(
                kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid
            ),
        )
    )
    return str(core.create_namespaced_service_account_token(sa_name, pod.metadata.namespace, request).status.token)
