"""The operator's cost counters, from what one reconcile's status write changed.

Counted once, at the transition: the figures come from `planning.cost.changes` between the
status the reconcile read and the one it wrote, after the write succeeded. A restarted operator
reads the written figures back as its `before`, so nothing is counted twice; a write that fails
counts nothing (the next reconcile makes and counts it).
"""

from __future__ import annotations

from mpjob.controller import metrics as om
from mpjob.planning.cost import changes, money
from mpjob_contract.accounting import CostPerGpuHour
from mpjob_contract.api import MixedPrecisionJobStatus


def count(before: MixedPrecisionJobStatus, after: MixedPrecisionJobStatus, price: CostPerGpuHour | None) -> None:
    """Add what `after` holds beyond `before` to the GPU-second (and, with a price, money) counters."""
    change = changes(before, after)
    for outcome, seconds in change.gpu_seconds.items():
        om.GPU_SECONDS.labels(outcome=outcome).inc(seconds)
        if price is not None:
            om.GPU_COST.labels(currency=price.currency, outcome=outcome).inc(money(seconds, price.amount))
    for reason, seconds in change.wasted_gpu_seconds.items():
        om.WASTED_GPU_SECONDS.labels(reason=reason).inc(seconds)
        if price is not None:
            om.WASTED_GPU_COST.labels(currency=price.currency, reason=reason).inc(money(seconds, price.amount))
