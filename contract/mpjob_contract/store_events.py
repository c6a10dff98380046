"""The event lines of the checkpoint store's own housekeeping (after a commit, in a bucket, among
the checkpoints a resume examines): what it left, capped or found of the bucket's server. Models
as `event_models`' (camelCase on the wire)."""

from __future__ import annotations

from mpjob_contract.event_models import TrainerEvent


class CheckpointHousekeepingFailed(TrainerEvent):
    """The checkpoint of `step` is written (its `checkpoint` line), but what follows its commit
    failed (`problem`: e.g. older checkpoints not pruned); the next save tries that again."""

    name = "checkpointHousekeepingFailed"
    step: int
    problem: str


class CheckpointUploadsLeft(TrainerEvent):
    """What a save uploaded below `prefix` stays although it did not commit: deleting it failed, or
    the bucket could not say whether the manifest whose put failed landed all the same."""

    name = "checkpointUploadsLeft"
    prefix: str
    problem: str


class CheckpointUploadsAborted(TrainerEvent):
    """Unfinished multipart uploads of saves killed midway, aborted at the attempt's start."""

    name = "checkpointUploadsAborted"
    count: int


class CheckpointListingCapped(TrainerEvent):
    name = "checkpointListingCapped"
    prefix: str
    listed: int


class CheckpointPutUnconditional(TrainerEvent):
    """The bucket's server does not honour a conditional put (`condition`: notImplemented, ignored):
    a commit looks at the manifest's key before a plain put (checkpoint.put_if_absent)."""

    name = "checkpointPutUnconditional"
    bucket: str
    condition: str


class CheckpointCandidatesCapped(TrainerEvent):
    name = "checkpointCandidatesCapped"
    found: int
    examined: int
