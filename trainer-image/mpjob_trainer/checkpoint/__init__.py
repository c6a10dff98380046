"""Checkpoints: exact-resume state, written atomically, verified before it is trusted.

- `manifest`: the on-disk format of one checkpoint (files, manifest, format version, hashing);
- `document`: a manifest's JSON as read (untrusted): its shape, bounds and safe file names;
- `checked`: a file read once, hashed as it is read, and loaded from the bytes checked;
- `peers`: the ranks that read or write one checkpoint together, and how they agree on it;
- `protocol`: Store, the few operations in which a volume and a bucket differ;
- `resume`, `ownership`: written once over any Store: which checkpoint an attempt resumes
  from; which checkpoints are its job's, what a save does at a taken step, keep-K pruning;
- `store`: CheckpointStore, a job's checkpoints in one folder (write, verify, list);
- `s3`, `bucket`: BucketCheckpointStore, the same in an S3-compatible bucket (sharded too:
  every rank uploads its own files); `bucket_files`: its objects as a source of checked copies,
  each rank reading only what it reads of a volume's; `rank_files`: a framework's files that
  ranks other than 0 write, uploaded into the checkpoint rank 0 commits;
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
from mpjob_trainer.checkpoint.ownership import CheckpointTaken
from mpjob_trainer.checkpoint.protocol import Store
from mpjob_trainer.checkpoint.staging import Staged, StagingBuffers, snapshot
from mpjob_trainer.checkpoint.store import CheckpointStore, SaveResult
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
    "Store",
    "WriteFailed",
    "sha256_file",
    "snapshot",
]
