"""Whether this replica may act. With kopf peering, kopf pauses its own watch on a standby, but
the work queue and the ticker are the operator's own: before each reconcile they ask here,
and the answer is read from the same peering object kopf keeps.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kubernetes.client.rest import ApiException

from mpjob.controller.cluster import Cluster
from mpjob.controller.config import Peering


def outranked(peers: dict[str, Any], *, peering: Peering, now: datetime) -> bool:
    """Whether a live peer other than this replica has the same or a higher priority (kopf's
    rule for who pauses). `peers` is the peering object's status: identity -> its last word."""
    for identity, peer in peers.items():
        if identity == peering.identity or not isinstance(peer, dict):
            continue
        seen = datetime.fromisoformat(str(peer.get("lastseen", "1970-01-01T00:00:00+00:00")))
        alive = (now - seen).total_seconds() < float(peer.get("lifetime", 60))
        if alive and int(peer.get("priority", 0)) >= peering.priority:
            return True
    return False


class PeeringCheck:
    """`active(namespace)`, read at most once per `trust_seconds` per peering object. A
    standalone operator (no peering) is always active."""

    def __init__(self, *, peering: Peering | None, cluster: Cluster, trust_seconds: float) -> None:
        self._peering, self._cluster, self._trust = peering, cluster, trust_seconds
        # scope -> (when read, active); the queue's threads share it (one dict get or set each)
        self._seen: dict[str, tuple[float, bool]] = {}

    def active(self, namespace: str) -> bool:
        if self._peering is None:
            return True
        scope = "" if self._peering.clusterwide else namespace
        checked = self._seen.get(scope)
        if checked is not None and time.monotonic() - checked[0] < self._trust:
            return checked[1]
        active = self._read(self._peering, namespace)
        self._seen[scope] = (time.monotonic(), active)
        return active

    def _read(self, peering: Peering, namespace: str) -> bool:
        try:
            body = self._cluster.read_peering(peering.name, None if peering.clusterwide else namespace)
        except ApiException:
            return False  # cannot tell: leave the work to kopf's own handlers
        return not outranked(body.get("status") or {}, peering=peering, now=datetime.now(UTC))
