"""How many workers of a job the ResourceQuotas of its namespace hold: an elastic job
(spec.elastic) grows on the nodes' free GPUs (`capacity`) only as far as these let its pods be
created. Without it, a job a quota shrank (`shortage.over_quota`) would grow back into the quota
at each checkpoint while the nodes have room, and shrink again once its wait is out.

Pure `quota_workers` over ResourceQuota documents as the API returns them: for each resource a
quota limits that a worker's pod asks for (`pods`, `requests.nvidia.com/gpu`, `requests.cpu`,
`limits.memory`, ... as resources.requests/limits and gpusPerWorker make the trainer's
container), what is free (`status.hard` less `status.used`) over what one worker asks, plus the
workers the running attempt holds (their use is in `used`, and theirs on a resize). A quota with
scopes (`scopes`, `scopeSelector`) is not read: which pods it counts is the API server's to say.
`QuotaReader` lists them (read rights only: resourcequotas list, with rbac.elasticCapacity); a
read refused or failed caps nothing, as before it was read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from kubernetes.utils.quantity import parse_quantity

from mpjob.builders.devices import trainer_resources
from mpjob.controller.quiet import QuietReads
from mpjob.planning.elastic import workers_of
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

if TYPE_CHECKING:
    from mpjob.controller.cluster import Cluster

#: Resources a quota may name without the `requests.` prefix, meaning requests.
BARE = ("cpu", "memory", "ephemeral-storage")


def _amount(value: Any) -> Decimal | None:
    try:
        return Decimal(parse_quantity(value))
    except (ValueError, TypeError, ArithmeticError):
        return None


def worker_demand(spec: MixedPrecisionJobSpec) -> dict[str, Decimal]:
    """What one worker's pod counts against a quota, by the quota's resource name: one pod, and
    its trainer container's requests (a resource it only limits requests its limit, as the API
    server defaults it) and limits."""
    resources = trainer_resources(spec)
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    demand = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for name in {**limits, **requests}:
        if (asked := _amount(requests.get(name, limits.get(name)))) is not None:
            demand[f"requests.{name}"] = asked
            if name in BARE:
                demand[name] = asked
    for name, value in limits.items():
        if (limit := _amount(value)) is not None:
            demand[f"limits.{name}"] = limit
    return demand


def quota_workers(spec: MixedPrecisionJobSpec, quotas: Iterable[Mapping[str, Any]], *, running: int) -> int | None:
    """Workers the unscoped `quotas` let the job's pods be created for, `running` of them its own
    already (None: no quota limits what a worker asks)."""
    demand, fits = worker_demand(spec), None
    for quota in quotas:
        scoped = quota.get("spec") or {}
        if scoped.get("scopes") or scoped.get("scopeSelector"):
            continue
        status = quota.get("status") or {}
        hard, used = status.get("hard") or {}, status.get("used") or {}
        for name, limit in hard.items():
            per, most, taken = demand.get(name), _amount(limit), _amount(used.get(name, "0"))
            if not per or most is None or taken is None:
                continue
            held = max(0, int((most - taken + running * per) // per))
            fits = held if fits is None else min(fits, held)
    return fits


class QuotaReader:
    """The ResourceQuotas of a job's namespace, read when an elastic job may grow (`within`); one
    refused for good (403: a chart without the rule) is said once and not asked again for a while."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._reads = QuietReads()

    def within(
        self, fits: int | None, spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, *, namespace: str
    ) -> int | None:
        """`fits` (workers the nodes hold for the job; None: it does not grow) no larger than its
        namespace's quotas hold (as it was when they cannot be read)."""
        if fits is None or not status.attempts:
            return fits
        quotas = self._reads.ask("resourcequotas for spec.elastic", lambda: self.cluster.resource_quotas(namespace))
        if quotas is None:
            return fits
        held = quota_workers(spec, quotas, running=workers_of(spec, status.attempts[-1]))
        return fits if held is None else min(fits, held)
