"""spec.elastic: a job that goes on with fewer workers when the cluster cannot hold all of
them, and grows back when it can (docs/elastic.md). `workers` stays the size the job wants;
without `elastic` every attempt has exactly `workers` pods, as before."""

from __future__ import annotations

from pydantic import Field

from mpjob_contract.vocabulary import MAX_WORKERS
from mpjob_contract.wire import ApiModel

#: waitSeconds at most: a week (an attempt that waits longer has other trouble).
MAX_WAIT_SECONDS = 7 * 24 * 3600


class Elastic(ApiModel):
    min_workers: int = Field(
        ge=1,
        le=MAX_WORKERS,
        description="The fewest workers an attempt may run with (at most `workers`); the global batch "
        "is kept at every size by raising gradient accumulation.",
    )
    wait_seconds: int = Field(
        300,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description="How long an attempt's pods may stay unschedulable before the job goes on with as "
        "many workers as the cluster holds now (a lost node shrinks at once).",
    )
