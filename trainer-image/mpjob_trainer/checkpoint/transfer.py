"""What a bucket store measures: upload seconds and bytes, failed commits, restore seconds.

TrainerMetrics carries these four (checkpoint_upload_seconds, ...) in the attempt's registry;
a store made without it (a test, a benchmark) measures into a private registry of its own.
The store reads the attributes at each use, so TrainerMetrics.relabel can rebind them.
"""

from __future__ import annotations

from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram

from mpjob_contract import metrics as names

#: Seconds of one upload or restore: from a MiB on a local server to GiBs over a WAN link.
TRANSFER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class TransferMetrics(Protocol):
    checkpoint_upload_seconds: Any
    checkpoint_upload_bytes: Any
    checkpoint_commit_failures: Any
    checkpoint_restore_seconds: Any


class PrivateTransferMetrics:
    """The four, unlabelled, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        on: dict[str, Any] = {"registry": self.registry}
        self.checkpoint_upload_seconds = Histogram(
            names.CHECKPOINT_UPLOAD_SECONDS, "upload", buckets=TRANSFER_BUCKETS, **on
        )
        self.checkpoint_upload_bytes = Counter(names.CHECKPOINT_UPLOAD_BYTES, "bytes", **on)
        self.checkpoint_commit_failures = Counter(names.CHECKPOINT_COMMIT_FAILURES, "failures", **on)
        self.checkpoint_restore_seconds = Histogram(
            names.CHECKPOINT_RESTORE_SECONDS, "restore", buckets=TRANSFER_BUCKETS, **on
        )
