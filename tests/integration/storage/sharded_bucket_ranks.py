"""One rank of two saving a sharded model to a bucket with ShardedWriter, run as its own process
by tests/integration/storage/test_s3_sharded_run.py:
`python sharded_bucket_ranks.py RANK OUT LOCATION ENDPOINT BUCKET`. The ranks meet in a gloo
process group (a FileStore in OUT) and write what each saw to OUT/rank<R>.json:

- step 2 saved by both;
- step 4 with rank 1's uploads failing (its bucket refuses every upload);
- step 6, whose place already holds a checkpoint another job committed;
- step 8, whose rank-1 shard is then damaged in the bucket;
- then the checkpoint a resume takes (resume.load on both ranks), and what each rank fetched of it
  to verify it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint import resume
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.sharded import ShardedWriter
from mpjob_trainer.checkpoint.shards import SHARDED_OBJECTS, SHARDS, state_dicts

JOB = "ns/job/uid"


def save(writer: ShardedWriter, objects: dict[str, Any], step: int) -> str:
    """How the save of `step` ended on this rank: its path, or the error it raised."""
    names = {"module": "model"}
    state = {SHARDS: state_dicts(objects, names), SHARDED_OBJECTS: names, "step": step, "rng": []}
    try:
        return writer.start(step, "bf16", state).finish().ref.path
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def refuse(*_: Any) -> None:
    raise OSError("injected: this rank cannot upload")


def record_whole_reads(store: BucketCheckpointStore) -> list[str]:
    """The keys of the objects `store` reads whole from now on (GET and streamed downloads)."""
    asked: list[str] = []

    def recording(call: Any) -> Any:
        def recorded(key: str, *args: Any, **kwargs: Any) -> Any:
            asked.append(key)
            return call(key, *args, **kwargs)

        return recorded

    store.bucket.get = recording(store.bucket.get)  # type: ignore[method-assign]
    store.bucket.download_into = recording(store.bucket.download_into)  # type: ignore[method-assign]
    return asked


def main() -> None:
    rank, out, location, endpoint, bucket = int(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:6]
    dist.init_process_group("gloo", store=dist.FileStore(str(out / "store"), 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 1))
    fully_shard(model)
    settings = S3Storage(bucket=bucket, endpoint=endpoint)
    store = BucketCheckpointStore(location, settings, keep=5, config_digest="digest", job=JOB)
    writer = ShardedWriter(store)
    seen: dict[str, Any] = {"saved": save(writer, {"model": model}, 2)}
    if rank == 1:
        store.bucket.upload = refuse  # type: ignore[method-assign]
    seen["refused"] = save(writer, {"model": model}, 4)
    if rank == 1:
        del store.bucket.upload  # the class's own again
    dist.barrier()  # the test's other job committed step 6 before the ranks started
    seen["taken"] = save(writer, {"model": model}, 6)
    seen["damaged"] = save(writer, {"model": model}, 8)
    if rank == 0:  # rank 1's shard of step 8, replaced in the bucket after the commit
        store.bucket.put(f"{store.key}/step-000000008/{writer.name}/__1_0.distcp", b"not the shard")
    dist.barrier()
    asked = record_whole_reads(store)
    loaded = resume.load(store)
    seen["resumed"] = loaded[0].step if loaded is not None else None
    place = f"/{loaded[0].path.rsplit('/', 1)[-1]}/" if loaded is not None else "-"
    seen["fetched"] = sorted({key.rsplit("/", 1)[-1] for key in asked if place in key})
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
