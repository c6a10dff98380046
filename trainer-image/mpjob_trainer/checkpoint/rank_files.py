"""The files of a framework's checkpoint that ranks other than 0 write, in a bucket store (checkpoint.s3).

A framework saves collectively, each rank writing files of one checkpoint folder (the HF Trainer:
rank 0 the weights, optimizer, scheduler and trainer state, every rank its own RNG state). On a
volume that folder is one on the filesystem the ranks share, and rank 0's store adopts it whole.
A bucket store's folders are each process's own (its spool): what another rank wrote would stay
there, and rank 0 commit a checkpoint without it, a partial one taken as whole (the Trainer then
resumes without that rank's RNG state, not exactly, with no more than a warning). So, as a sharded
save's ranks do (checkpoint.sharded): rank 0 checks the step's place first (nothing goes up unless
it is free to take), each other rank uploads its own files into the save's writer folder below
the step's prefix (rank 0's name) and removes them from its spool, the ranks agree that every
upload completed (`join`), and rank 0's `write` names them in the manifest beside its own files.
A rank whose upload failed fails the save, and what the others uploaded is deleted; so is what a
write that commits nothing leaves (BucketCheckpointStore.write).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mpjob_trainer.checkpoint.manifest import FRAMEWORK, hash_tree
from mpjob_trainer.checkpoint.objects import Published, new_writer
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.checkpoint.sharded import failure, reason
from mpjob_trainer.checkpoint.store import SaveResult


@dataclass(frozen=True)
class Joined:
    """On rank 0: the files the other ranks published, and why a rank's did not go up."""

    published: Published
    problems: list[str | Exception]


def join(store: AnyStore, step: int, staging: Path, written: Path, peers: Peers) -> Joined | None:
    """Every rank, once each wrote its files of the framework's save of `step` (`written`, in its
    `staging`): on rank 0 what the others published; None where no rank's files are apart from
    rank 0's (a volume, one rank)."""
    if not isinstance(store, BucketCheckpointStore) or peers.size == 1:
        return None
    writer, free = peers.from_main((new_writer(), _free(store, step)) if peers.rank == 0 else None)
    mine: tuple[dict[str, Any], str | Exception | None] = ({}, None)
    if peers.rank != 0:
        try:
            mine = (_publish(store, step, written, writer) if free else {}), None
        except Exception as exc:
            mine = {}, reason(exc, f"rank {peers.rank}: ")
        finally:
            shutil.rmtree(staging, ignore_errors=True)  # this rank's own spool's: what it holds is up, or never goes
    said = peers.gather(mine)
    files = {name: meta for files, _ in said[1:] for name, meta in files.items()}
    return Joined(Published(writer, files), [problem for _, problem in said if problem])


def _free(store: BucketCheckpointStore, step: int) -> bool:
    """Rank 0: may the ranks upload into the place of `step`? Not when `write` will commit nothing
    there (this job's checkpoint kept, CheckpointTaken, a failed look): it meets that itself."""
    try:
        return store.taken(step) is None
    except Exception:
        return False


def _publish(store: BucketCheckpointStore, step: int, written: Path, writer: str) -> dict[str, Any]:
    """This rank's files of the save (none: the framework wrote none on it), uploaded under the names
    they have in the checkpoint (below FRAMEWORK, as rank 0's adopted folder has them)."""
    if not written.is_dir():
        return {}
    folder = store.root / f".tmp-{step:09d}-rank-{writer}"
    folder.mkdir()
    try:
        written.rename(folder / FRAMEWORK)
        files = hash_tree(folder)
        store.publish(step, folder, files, writer=writer)
        return files
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write(
    store: AnyStore, step: int, precision: str, state: dict[str, Any], adopt: Path, joined: Joined | None
) -> SaveResult:
    """Rank 0: the framework's checkpoint of `step`, its folder `adopt`ed, the other ranks' files
    (`joined`) named in it; the save fails, and what they uploaded goes, when a rank's did not go up."""
    if joined is None:
        return store.write(step, precision, state, adopt=adopt)
    assert isinstance(store, BucketCheckpointStore)
    if joined.problems:
        store.withdraw(step, sorted(joined.published.files), writer=joined.published.writer)
        raise failure(joined.problems)
    return store.write(step, precision, state, adopt=adopt, joined=joined.published)
