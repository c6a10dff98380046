"""Which store holds an attempt's checkpoints: its launch's checkpointDir says (a folder of the
volume, or an `s3://` location of the spec's checkpoint.storage.s3)."""

from __future__ import annotations

from pathlib import Path

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.storage import is_bucket_url
from mpjob_trainer.checkpoint import unloadable
from mpjob_trainer.checkpoint.lineage import Lineage
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.store import CheckpointStore, Log
from mpjob_trainer.checkpoint.transfer import TransferMetrics
from mpjob_trainer.errors import ConfigError

AnyStore = CheckpointStore | BucketCheckpointStore


def open_store(
    launch: AttemptLaunch, *, config_digest: str, log: Log, metrics: TransferMetrics | None = None
) -> AnyStore:
    """The attempt's store; a bucket is probed here, so a wrong one ends the attempt at once."""
    keep, job, where = launch.spec.checkpoint.keep, launch.job_identity, launch.checkpoint_dir
    build = unloadable.launched(launch)  # the marks of checkpoints that did not load name it
    lineage = Lineage.of(launch)  # who writes, and which earlier writers it may go on from
    if not is_bucket_url(where):
        return CheckpointStore(Path(where), keep, config_digest, log, job=job, build=build, lineage=lineage)
    settings = launch.spec.checkpoint.s3
    if settings is None:
        raise ConfigError(f"checkpointDir {where!r} is a bucket, but the spec has no checkpoint.storage.s3")
    return BucketCheckpointStore(
        where, settings, keep=keep, config_digest=config_digest, job=job, log=log, metrics=metrics, build=build,
        lineage=lineage,
    )  # fmt: skip
