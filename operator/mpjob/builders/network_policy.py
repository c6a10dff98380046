"""The attempt's NetworkPolicy: who may open connections to its trainer pods.

A NetworkPolicy is namespaced and attempt pods live in the users' namespaces, so the operator
makes one per attempt beside its Service, controlled by the attempt's Job and kept by its pods
until the last is gone (`controller/keepers.py`; docs/security.md says why this, and not
policies the chart renders per namespace).

Ingress to the attempt's pods is admitted only
- from pods of the same attempt, on every port: rank 0's rendezvous port (torch.distributed's
  TCPStore) is the one fixed port, but NCCL and Gloo then connect the ranks to each other on
  ports they pick at run time, so a port list would break every multi-pod attempt;
- to the metrics port, from the operator's pods (live progress) and from the pods that
  `MetricsReaders.monitoring_pods` selects in the namespaces `monitoring_namespaces` selects
  (Prometheus).
Egress is left alone: trainers reach object stores, DNS and package mirrors the cluster's own
policies decide on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mpjob.builders.attempt import LABEL_ATTEMPT, LABEL_JOB, attempt_name, labels
from mpjob_contract import metrics as metric_names

#: The label the API server puts on every namespace (its name): selects one namespace.
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True, slots=True)
class MetricsReaders:
    """Who besides the attempt's own pods may connect to a trainer, and only to its metrics
    port: the operator's pods (its namespace and pod labels) and, when `monitoring_namespaces`
    is set, the pods `monitoring_pods` selects in those namespaces. Selectors are Kubernetes
    LabelSelectors (matchLabels / matchExpressions); an empty `monitoring_pods` is every pod."""

    operator_namespace: str
    operator_labels: dict[str, str]
    monitoring_namespaces: dict[str, Any] | None = None
    monitoring_pods: dict[str, Any] = field(default_factory=dict)


def attempt_selector(job: str, index: int) -> dict[str, Any]:
    """The attempt's pods, as its Service selects them."""
    return {"matchLabels": {LABEL_JOB: job, LABEL_ATTEMPT: str(index)}}


def _metrics_peers(readers: MetricsReaders) -> list[dict[str, Any]]:
    operator = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: readers.operator_namespace}},
        "podSelector": {"matchLabels": dict(readers.operator_labels)},
    }
    if readers.monitoring_namespaces is None:
        return [operator]
    monitoring = {
        "namespaceSelector": dict(readers.monitoring_namespaces),
        "podSelector": dict(readers.monitoring_pods),
    }
    return [operator, monitoring]


def attempt_network_policy(
    job: str, namespace: str, *, index: int, precision: str, readers: MetricsReaders
) -> dict[str, Any]:
    """The NetworkPolicy of attempt `index` of `job` (named like its Job and Service)."""
    pods = attempt_selector(job, index)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": attempt_name(job, index), "namespace": namespace, "labels": labels(job, index, precision)},
        "spec": {
            "podSelector": pods,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": pods}]},
                {
                    "from": _metrics_peers(readers),
                    "ports": [{"protocol": "TCP", "port": metric_names.DEFAULT_METRICS_PORT}],
                },
            ],
        },
    }
