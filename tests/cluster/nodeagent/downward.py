"""The downward API: what a pod may read about itself through `fieldRef`, in env values
and in downwardAPI volumes. Job's completion index reaches an Indexed Job's pods this way
(`metadata.annotations['batch.kubernetes.io/job-completion-index']`)."""

from __future__ import annotations

from typing import Any

LABELS = "metadata.labels['"
ANNOTATIONS = "metadata.annotations['"


def field_value(pod: Any, path: str, ip: str) -> str:
    """The value at a fieldRef path ("" for a path the agent does not know)."""
    meta = pod.metadata
    if path.startswith(LABELS):
        return str((meta.labels or {}).get(path[len(LABELS) : -2], ""))
    if path.startswith(ANNOTATIONS):
        return str((meta.annotations or {}).get(path[len(ANNOTATIONS) : -2], ""))
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
