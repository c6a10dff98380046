"""The operator's liveness (kopf's /healthz on `mpjob operator --health-port`, which the chart
probes): alive while kopf's watch of MixedPrecisionJobs and the child cache's list + watches
live. A dead watch leaves the process up but blind: jobs created meanwhile would never run.

Our watches say themselves whether they are dead (`watch.ListWatch.dead`). kopf runs each of its
watches as an asyncio task named "watcher for <resource>@<namespace>" and stops the operator
when one fails; one that is gone without that is counted against the most seen at once, so a
kopf that named its tasks otherwise would never be taken for a dead one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

KOPF_WATCHER = "watcher for "


@dataclass
class Liveness:
    """What the probe reads: kopf's watcher tasks of `plural`, and the cache's dead watches."""

    plural: str
    dead_watches: Callable[[], list[str]]
    most_seen: int = 0  # kopf watcher tasks alive at once, at most

    def kopf_watchers(self) -> int:
        """kopf's live watcher tasks of our resource (call it in the event loop)."""
        prefix = f"{KOPF_WATCHER}{self.plural}."  # "watcher for mixedprecisionjobs.v1alpha1.mpjob.dev@ns"
        return sum(1 for task in asyncio.all_tasks() if task.get_name().startswith(prefix))

    def problems(self) -> list[str]:
        """Why the operator is not alive; empty while it is."""
        found = self.dead_watches()
        alive = self.kopf_watchers()
        self.most_seen = max(self.most_seen, alive)
        if alive < self.most_seen:
            found.append(f"kopf watches {self.plural} in {alive} of the {self.most_seen} places it did")
        return found
