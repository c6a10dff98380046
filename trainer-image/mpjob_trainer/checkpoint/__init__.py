"""Checkpoints: exact-resume state, written atomically, verified before it is trusted.

- `manifest`: the on-disk format of one checkpoint (files, manifest, format version, hashing);
- `document`: a manifest's JSON as read (untrusted): its shape, bounds and safe file names;
- `store`: CheckpointStore, a job's checkpoints in one folder (write, verify, list, prune);
- `resume`: which checkpoint an attempt resumes from;
- `migrate`: an older format brought forward to the current one;
- `staging`, `writer`: the private host copy of the state and the thread that writes it
  (session.checkpointing.Checkpointer drives them);
- `shards`, `sharded`: the layout of a sharded model's checkpoint (every rank writes its shards
  with torch.distributed.checkpoint, rank 0 commits the manifest last), reading it on any
  world size, and one rank's side of writing it.
"""

from mpjob_trainer.checkpoint.manifest import (
    FORMAT_VERSION,
    FRAMEWORK,
    MANIFEST,
    STATE,
    CorruptCheckpoint,
    sha256_file,
)
from mpjob_trainer.checkpoint.staging import Staged, StagingBuffers, snapshot
from mpjob_trainer.checkpoint.store import CheckpointStore, CheckpointTaken, SaveResult
from mpjob_trainer.checkpoint.writer import BackgroundWriter, WriteFailed

__all__ = [
    "FORMAT_VERSION",
    "FRAMEWORK",
    "MANIFEST",
    "STATE",
    "BackgroundWriter",
    "CheckpointStore",
    "CheckpointTaken",
    "CorruptCheckpoint",
    "SaveResult",
    "Staged",
    "StagingBuffers",
    "WriteFailed",
    "sha256_file",
    "snapshot",
]
