"""ShardedWriter: one rank's side of writing a sharded checkpoint (checkpoint.shards has the
layout and the whole story): every rank's staging copy agreed, DCP's save, then the agreement
and rank 0's commit.

To a bucket (BucketCheckpointStore) DCP writes the same files into this rank's private spool
folder; rank 0 first checks the step's place (as a single-file save does: another job's or an
unreadable checkpoint there means nothing is written, this job's valid one is kept), then every
rank uploads its own files into the writer's folder below the step's prefix (`name`, rank 0's:
checkpoint.objects; no gather onto one rank), the ranks agree that every upload completed, and
rank 0 puts the manifest last: the commit, then keep-K; or, when a rank failed, deletes what
the others uploaded (a failing rank deletes its own).
What no retry fixes (CheckpointTaken, a ConfigError: a value a restore could not read back, a
bucket refusing us) ends the save on every rank as itself, as it ends a single-file save.

The training thread only captures (references to its shards, a copy of the small state and of
the tensors that are no shards, which a forward pass changes: `whole_copied`) and hands over;
DCP's save begins on the writer thread, so its set-up (planning, the stager's and the upload's
threads) costs the training thread nothing but the GIL it shares with them."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from mpjob_trainer.checkpoint.dcp_files import INDEX, index_size_problem
from mpjob_trainer.checkpoint.manifest import check_loadable, hash_files
from mpjob_trainer.checkpoint.objects import new_writer
from mpjob_trainer.checkpoint.ownership import CheckpointTaken
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.checkpoint.shards import SHARDS, rank_file
from mpjob_trainer.checkpoint.staging import snapshot
from mpjob_trainer.checkpoint.store import SaveResult
from mpjob_trainer.distributed import is_dtensor
from mpjob_trainer.errors import ConfigError


class StateOnlyWriter(dcp.FileSystemWriter):
    """DCP's file writer whose index (.metadata) holds the state's layout and nothing of the save:
    FileSystemWriter pickles its folder (a temporary name, the run's --out) and a random save id
    into it, so two saves of one state hashed apart, and the state sha256 (the manifest's digest
    of every file) named the save, not the state. Loading never reads either."""

    def storage_meta(self) -> StorageMeta | None:
        return None


@dataclass
class PendingSave:
    """A sharded save under way: `staged` completes when the shards are copied off the
    training's tensors; `finish` (any thread) waits for the write, agrees and commits."""

    staged: Future[None]
    finish: Callable[[], SaveResult]


class ShardedWriter:
    """One rank's side of the sharded saves of a run (call every method on every rank)."""

    def __init__(self, store: AnyStore) -> None:
        self.store = store
        cuda = torch.cuda.is_available()
        self.options = StagingOptions(
            use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
        )
        self.stager = DefaultStager(self.options)
        group = dist.new_group(backend="gloo") if dist.is_available() and dist.is_initialized() else None
        #: The checkpoint's own group (made collectively, here on the training thread).
        self.peers = Peers.current(group if isinstance(group, dist.ProcessGroup) else None)
        #: Names this writer's folders, local and in a bucket (rank 0's, agreed): no other writer's
        #: (another attempt's ranks) are the same.
        self.name = self.peers.from_main(new_writer())

    def start(self, step: int, precision: str, state: dict[str, Any]) -> PendingSave:
        """Take `state` (a TrainingState capture: live shards under SHARDS) as `step`'s
        checkpoint. The training thread does no more than copy the small state and the tensors
        that are no shards (`whole_copied`): DCP's save, its staging included, begins in
        `finish`, on the writer thread."""
        started = time.perf_counter()
        shards, local = whole_copied(state[SHARDS]), snapshot({k: v for k, v in state.items() if k != SHARDS})
        staged: Future[None] = Future()

        def finish() -> SaveResult:
            upload = self._begin(step, shards, staged)
            written = {**local, SHARDS: shards}  # what the rank file and DCP hold of the save
            return self._finish(
                step, precision, tmp=self._folder(step), written=written, upload=upload, started=started
            )

        return PendingSave(staged, finish)

    def _folder(self, step: int) -> Path:
        return self.store.root / f".tmp-{step:09d}-dcp-{self.name}"

    def _begin(self, step: int, shards: dict[str, Any], staged: Future[None]) -> Future[Any]:
        """DCP's save of this rank's shards, once every rank has its staging copy (`staged`
        completes with this rank's): DCP plans with collectives, so a rank whose copy or folder
        failed alone would leave the others waiting in them, and its next save's collectives
        would meet theirs of this one. Every rank ends the save alike when any failed (the
        first reason, or an OSError naming them all)."""
        tmp, problem = self._folder(step), None
        try:
            copy = self._staged(tmp, shards, staged)
        except Exception as exc:
            problem = reason(exc, f"rank {self.peers.rank}: ")
        problems = [p for p in self.peers.gather(problem) if p]
        if problems:
            shutil.rmtree(tmp, ignore_errors=True)
            raise failure(problems)
        writer = StateOnlyWriter(str(tmp), single_file_per_rank=True, sync_files=True, thread_count=1)
        upload: Future[Any] = Future()
        alone = self.peers.size == 1 and self.peers.group is None
        try:
            upload.set_result(dcp.save(copy, storage_writer=writer, process_group=self.peers.group, no_dist=alone))
        except Exception as exc:
            upload.set_exception(exc)
        except dcp.CheckpointException as exc:  # a BaseException: any rank's failure while writing, on every rank
            upload.set_exception(_not_written(exc))
        return upload

    def _staged(self, tmp: Path, shards: dict[str, Any], staged: Future[None]) -> Any:
        """This rank's staging copy of `shards` (DCP's stager copies in its own thread), waited
        for here; `staged` completes with it, or with why it failed."""
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            stager = self._fresh_stager()
            copy = stager.stage(shards)
            if isinstance(copy, Future):
                copy = copy.result()
            elif stager.should_synchronize_after_execute:
                stager.synchronize_staging()
        except BaseException as exc:
            _settle_failed(staged, exc)  # the training thread must not wait for a copy never made
            raise
        staged.set_result(None)
        return copy

    def _fresh_stager(self) -> DefaultStager:
        """A stager of its own for the next save, the last one closed (on the writer thread,
        after the last save's staging). torch 2.11's DefaultStager closes itself once it has
        staged (a second save through it fails with KeyError: <class 'type'>) and torch offers no
        public way to tell a spent one; a new one per save costs the reuse of pinned buffers on CUDA."""
        self.stager.close()
        self.stager = DefaultStager(self.options)
        return self.stager

    def _finish(
        self, step: int, precision: str, *, tmp: Path, written: dict[str, Any], upload: Future[Any], started: float
    ) -> SaveResult:
        peers, remote = self.peers, isinstance(self.store, BucketCheckpointStore)
        mine, problem = self._own_files(step, tmp, written, upload)
        try:
            if remote:  # nothing goes up before rank 0 knows the step's place is free to take
                ended = peers.from_main(self._claim(step) if peers.rank == 0 else None)
                if ended is not None:
                    return _result(ended, started)
                problem = problem or self._publish(step, tmp, mine)
            outcomes = peers.gather((mine, problem))  # the agreement: every rank wrote, or who did not
            ended = self._commit(step, precision, tmp=tmp, outcomes=outcomes) if peers.rank == 0 else None
            return _result(peers.from_main(ended), started)
        finally:
            if remote:
                shutil.rmtree(tmp, ignore_errors=True)  # this rank's spool: its files are in the bucket now

    def _own_files(
        self, step: int, tmp: Path, written: dict[str, Any], upload: Future[Any]
    ) -> tuple[dict[str, Any], str | Exception | None]:
        """This rank's files of the save (`written`: its small state, and its shards under SHARDS),
        written and hashed (DCP's and its rank file), once a restore is known to read them back
        weights-only; or why not."""
        rank = self.peers.rank
        try:
            upload.result()
            check_loadable(written, step)
            own = tmp / rank_file(rank)
            torch.save({k: v for k, v in written.items() if k != SHARDS}, own)
            paths = [own, *tmp.glob(f"__{rank}_*.distcp")]
            if rank == 0:
                paths.append(_readable_index(tmp, step))
            return hash_files(tmp, paths), None
        except Exception as exc:
            return {}, reason(exc, f"rank {rank}: ")

    def _claim(self, step: int) -> Any:
        """Rank 0, bucket: None when the step is free; this job's valid checkpoint there (kept,
        never overwritten: its ref and size); why the save must write nothing (`reason`)."""
        assert isinstance(self.store, BucketCheckpointStore)
        try:
            kept = self.store.taken(step)
        except Exception as exc:
            return reason(exc)
        return (kept, 0, None) if kept is not None else None

    def _publish(self, step: int, tmp: Path, files: dict[str, Any]) -> str | Exception | None:
        """Upload this rank's `files` below the step's prefix (not the commit); why not, if it failed."""
        assert isinstance(self.store, BucketCheckpointStore)
        try:
            self.store.publish(step, tmp, files, writer=self.name)
        except Exception as exc:
            return reason(exc, f"rank {self.peers.rank}: ")
        return None

    def _commit(self, step: int, precision: str, *, tmp: Path, outcomes: list[Any]) -> Any:
        """Rank 0: the manifest over every rank's files, then the rename; why not (`reason`), when not."""
        problems = [problem for _, problem in outcomes if problem]
        files = {name: meta for files, problem in outcomes if not problem for name, meta in files.items()}
        try:
            if problems:
                self._withdraw(step, files)
                raise failure(problems)
            if isinstance(self.store, BucketCheckpointStore):
                result = self.store.commit(tmp, step, precision, files, world_size=self.peers.size, writer=self.name)
            else:
                result = self.store.commit(tmp, step, precision, files, world_size=self.peers.size)
        except Exception as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            return reason(exc)
        return result.ref, result.bytes, result.housekeeping

    def _withdraw(self, step: int, files: dict[str, Any]) -> None:
        """Rank 0, bucket, a rank failed: the files the others uploaded go (no manifest will name them)."""
        if isinstance(self.store, BucketCheckpointStore):
            self.store.withdraw(step, sorted(files), writer=self.name)


def whole_copied(obj: Any) -> Any:
    """`obj` (DCP state dicts) with its tensors that are not shards copied now, on the device: a
    forward pass changes buffers (a BatchNorm's running statistics; FSDP2 leaves buffers whole,
    plain tensors) in place, and the training thread runs the next one before DCP's stager copies
    anything. The shards (DTensors) change only in an optimizer update, which waits for the stager
    (`PendingSave.staged`); what is copied here is small, and a device copy holds no host sync."""
    if isinstance(obj, torch.Tensor):
        return obj if is_dtensor(obj) else obj.detach().clone()
    if isinstance(obj, dict):
        return {key: whole_copied(value) for key, value in obj.items()}
    if isinstance(obj, list):
        return [whole_copied(value) for value in obj]
    return obj


def _readable_index(tmp: Path, step: int) -> Path:
    """DCP's index written into `tmp`; a ConfigError when no restore would read it (no retry
    makes it smaller: the model's tensors times the ranks), rather than a checkpoint that every
    resume passes over as damaged."""
    index = tmp / INDEX
    too_big = index_size_problem(index.stat().st_size)
    if too_big is not None:
        raise ConfigError(f"the checkpoint of step {step}: DCP wrote its {too_big}")
    return index


def reason(exc: Exception, rank: str = "") -> str | Exception:
    """How a rank tells the others why its part failed: what no retry fixes (CheckpointTaken, a
    ConfigError such as a value a restore cannot read or BucketMisconfigured) as itself, to be
    raised on every rank as a single-file save raises it; anything else as a reason."""
    return exc if isinstance(exc, (CheckpointTaken, ConfigError)) else f"{rank}{type(exc).__name__}: {exc}"


def failure(problems: list[str | Exception]) -> Exception:
    """What the ranks' `problems` (`reason`'s) end a save with: the first no retry fixes, as itself;
    else an OSError naming them all."""
    return next((p for p in problems if isinstance(p, Exception)), OSError("; ".join(map(str, problems))))


def _result(ended: Any, started: float) -> SaveResult:
    """How rank 0 said the save ended, on every rank: (ref, bytes, what its housekeeping left), what
    no retry fixes (`reason`: raised as itself), or the reason it failed (OSError)."""
    if isinstance(ended, Exception):
        raise ended
    if isinstance(ended, str):
        raise OSError(ended)
    ref, size, left = ended
    return SaveResult(ref, time.perf_counter() - started, size, left)


def _not_written(exc: Any) -> OSError:
    """A failed save's reason from DCP's CheckpointException: its first rank's (exception, traceback)."""
    rank, cause = min(exc.failures.items(), key=lambda item: item[0], default=(0, (exc,)))
    cause = cause[0] if isinstance(cause, tuple) else cause
    return OSError(f"DCP could not write the shards (rank {rank}: {type(cause).__name__}: {str(cause)[:300]})")


def _settle_failed(staged: Future[None], exc: BaseException) -> None:
    if not staged.done():
        staged.set_exception(exc)
