"""Checkpointer: when and by whom checkpoints are written, and what a failed write costs.

Every rank reaches the same step boundary; rank 0 stages the state there into reusable host
buffers (StagingBuffers: device copies issued, not awaited) and the Checkpointer's writer
thread has CheckpointStore write and hash it once the copies have landed. The training thread waits
for the previous save only when the next one is due (its buffers are about to be refilled),
so a save costs it the wait, the capture and the issuing of the copies: that stall is
logged (`checkpointStaged`) and observed (mpjob_trainer_checkpoint_stall_seconds).
The final checkpoint (end of training, or preemption) is written on the training thread and
every rank waits for it at a barrier: the attempt may not claim success, or exit 44, before
it is durable. A failed asynchronous write is counted and logged and training goes on: the
last good checkpoint stays the previous one and the next interval tries again. A write is failed
only up to its commit point (the store's rename, a bucket's manifest): one whose housekeeping
after it failed (keep-K's pruning) is the checkpoint, reported so, and the housekeeping's failure
is logged beside it (`checkpointHousekeepingFailed`).

The Checkpointer alone knows which checkpoint is good (`last_good`): the one resumed from, each save
once durable and reported (`_saved`), the one going back settles on (`back_to`: one damaged since is
passed over). The live series follow it (`_trust`). The stores only persist and read.

Under a sharded model (`sharded`, set when the run registers its state) every rank writes:
each stages its own shards and writes them in the background (checkpoint.sharded; to a bucket
each rank uploads its own files and rank 0 commits the manifest last), the
training thread waiting for the staging copy only in `before_update`, which an optimizer
step pre-hook calls before the step may change what is copied; that wait counts into the stall. Collecting a
save and its outcome happen on every rank (rank 0 alone logs).

The Checkpointer owns the staging buffers and the writer thread; the session and its collaborators use only
its public methods (open, finite, save, collect, settle, reload, back_to, clean_stale, last_good, root).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpjob_contract.report import CheckpointRef
from mpjob_trainer import distributed as dist_env
from mpjob_trainer.checkpoint import BackgroundWriter, SaveResult, StagingBuffers, Store, WriteFailed, resume
from mpjob_trainer.checkpoint.resume import Loaded, Restore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.agreement import main_says
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import StepNumerics

if TYPE_CHECKING:  # imported when a sharded model first saves (DCP: see checkpoint.shards)
    from mpjob_trainer.checkpoint.sharded import PendingSave, ShardedWriter


class Checkpointer:
    def __init__(self, store: AnyStore, world: World, log: EventLog, metrics: TrainerMetrics) -> None:
        self.store = store
        self.world = world
        self.log = log
        self.metrics = metrics
        self.failures = 0
        self.staging = StagingBuffers()
        self.writer: BackgroundWriter[SaveResult] = BackgroundWriter()
        #: Every rank writes its shards (the run's model is sharded); see the module's docstring.
        self.sharded = False
        self._shards: ShardedWriter | None = None
        #: A sharded save whose staging copy the next optimizer step waits for, and the stall so far.
        self._staging: tuple[int, PendingSave, float] | None = None
        #: The staging buffers have been reserved (or a save allocated them).
        self._reserved = False
        #: The newest checkpoint known good: the one resumed from, or the last save reported.
        self.last_good: CheckpointRef | None = None

    @property
    def root(self) -> Path:
        """The job's checkpoint folder."""
        return self.store.root

    # ---------------------------------------------------------------- resuming
    def clean_stale(self) -> None:
        """Remove what saves killed midway left behind (call on rank 0, before `load`)."""
        self.store.clean_stale()

    def open(
        self, state: TrainingState, prefer: str | None, precision: str, scaler: Any
    ) -> tuple[CheckpointRef, int] | None:
        """Every rank, once: what killed saves left is removed (rank 0), then the checkpoint to
        resume from (checkpoint.resume's policy, preferring ones this `precision` wrote after
        `prefer`) is loaded into `state`: its ref and applied-step count (TrainingState.restore),
        else None. One whose files verify and still do not load is rejected for the previous
        good one. A sharded `state` is written by every rank, and its optimizers wait for a
        save's staging copy before they step (`before_update`)."""
        self.hook(state)
        if self.world.is_main:
            self.clean_stale()
        dist_env.barrier(self.world)
        applied: list[int] = []

        def restore(loaded: Loaded) -> None:
            applied[:] = [state.restore(loaded[1], precision, scaler)]

        store: Store[Any] = self.store  # a volume's places or a bucket's: resume.load takes either
        loaded = resume.load(store, prefer, newer_in=precision, restore=restore)
        if loaded is None:
            return None
        self._trust(loaded[0])
        return loaded[0], applied[0]

    def resume(self, state: TrainingState, numerics: StepNumerics, prefer: str | None) -> CheckpointRef | None:
        """Load the attempt's checkpoint (`prefer`, else checkpoint.resume's choice) into `state`
        and the step's numbers (`open`); its ref, or None: a fresh start. The optimizers are
        hooked after loading (DCP may step an empty optimizer once)."""
        amp = numerics.precision
        opened = self.open(state, prefer, amp.precision, amp.scaler)
        if opened is None:
            self.log("freshStart", reason=f"no valid checkpoint in {self.root}: starting at step 0")
        else:
            ref, numerics.applied.count = opened
            self.log("resume", step=ref.step, path=ref.path, sha256=ref.sha256, fromPrecision=ref.precision)
        self.watch(state, numerics)
        return opened[0] if opened is not None else None

    def hook(self, state: TrainingState) -> None:
        """Write what `state` holds: a sharded one by every rank, its optimizers awaiting staging (`before_update`)."""
        self.sharded = state.sharded is not None
        for optimizer in state.optimizers() if self.sharded else []:
            optimizer.register_step_pre_hook(lambda *_: self.before_update())

    @staticmethod
    def watch(state: TrainingState, numerics: StepNumerics) -> None:
        """Hook `state`'s optimizers for the guard once a checkpoint is loaded (DCP may step an empty one)."""
        for optimizer in state.optimizers():
            numerics.applied.watch(optimizer)

    def reload(
        self, state: TrainingState, before: int, precision: str, scaler: Any
    ) -> tuple[CheckpointRef, int] | None:
        """Every rank: load rank 0's last good checkpoint into `state` when it is at or before step
        `before` (None: there is none), by `back_to`'s rule. Its ref and applied-step count."""
        applied: list[int] = []

        def restore(loaded: Loaded) -> None:
            applied[:] = [state.restore(loaded[1], precision, scaler)]

        loaded = self.back_to(before, restore)
        return (loaded[0], applied[0]) if loaded is not None else None

    def back_to(self, before: int, restore: Restore) -> Loaded | None:
        """Every rank: the last good checkpoint (rank 0's), loaded by `restore`, when it is at or
        before step `before` (None: there is none), verified again; one damaged since, or that does
        not load, is rejected for the one before it, as a resume would (checkpoint.resume.back_to),
        and that one becomes the last good one. NoGoodCheckpoint when none loads."""
        ref = main_says(self.last_good, self.world)
        if ref is None or ref.step > before:
            return None
        store: Store[Any] = self.store  # a volume's places or a bucket's
        try:
            loaded = resume.back_to(store, ref.step, restore)
        except resume.NoGoodCheckpoint:
            self._trust(None)  # what is on the store no longer loads: no checkpoint is claimed good
            raise
        self._trust(loaded[0])  # one passed over (damaged since) is no longer named, live either
        return loaded

    def _trust(self, ref: CheckpointRef | None) -> None:
        """`ref` is the last good checkpoint now (None: none is), live too: no scrape names one passed over."""
        self.last_good = ref
        self.metrics.checkpoint_good(ref)

    # ---------------------------------------------------------------- saving
    def finite(self, state: TrainingState) -> bool:
        """Is what a checkpoint of `state` holds finite (TrainingState.finite)? Every rank: a collective."""
        return state.finite()

    def save(self, step: int, precision: str, capture: Callable[[], dict[str, Any]], *, final: bool) -> None:
        """Checkpoint the state `capture` returns at `step`; call on every rank."""
        if self.sharded:
            self._save_sharded(step, precision, capture, final=final)
        elif self.world.is_main:
            if final:
                self._save_now(step, precision, capture)
            else:
                self._save_async(step, precision, capture)
        if final:
            dist_env.barrier(self.world)

    def reserve(self, capture: Callable[[], dict[str, Any]]) -> None:
        """Before the first asynchronous save (rank 0, a model not sharded): allocate its staging
        buffers in the background (StagingBuffers.reserve), once; `capture` is the state's."""
        if self.world.is_main and not self.sharded and not self._reserved:
            self._reserved = True
            self.staging.reserve(capture())

    def _save_async(self, step: int, precision: str, capture: Callable[[], dict[str, Any]]) -> None:
        """Stage now, write in the background; log how long the training thread was held."""
        start = time.perf_counter()
        self.collect(block=True, training_step=step)  # the previous write is done: buffers are free
        self._reserved = True
        staged = self.staging.stage(capture())
        store = self.store

        def write() -> SaveResult:
            staged.ready()  # the staged device copies have landed
            return store.write(step, precision, staged.state)

        self.writer.submit(step, write)
        stall = time.perf_counter() - start
        self.metrics.checkpoint_stall.observe(stall)
        self.log("checkpointStaged", step=step, stallSeconds=round(stall, 6))

    def _save_sharded(self, step: int, precision: str, capture: Callable[[], dict[str, Any]], *, final: bool) -> None:
        """Every rank: begin writing its shards; a final save is waited for here."""
        start = time.perf_counter()
        self.collect(block=True, training_step=step)
        if self._shards is None:
            from mpjob_trainer.checkpoint.sharded import ShardedWriter

            self._shards = ShardedWriter(self.store)  # its process group is made by all ranks, here
        pending = self._shards.start(step, precision, capture())
        if final:
            try:
                result = pending.finish()
            except Exception as exc:
                self._failed(step, step, exc)
                raise  # no final checkpoint: this attempt cannot claim success
            self._saved(result, asynchronous=False)
            return
        self.writer.submit(step, pending.finish)
        self._staging = (step, pending, time.perf_counter() - start)

    def before_update(self) -> None:
        """Wait until a sharded save's staging copy is done (call before an optimizer step:
        the step changes the weights and optimizer state being copied). Its failure is the
        save's, reported when the save is collected."""
        if self._staging is None:
            return
        (step, pending, held), self._staging = self._staging, None
        start = time.perf_counter()
        with contextlib.suppress(Exception):
            pending.staged.result()
        stall = held + time.perf_counter() - start
        self.metrics.checkpoint_stall.observe(stall)
        self.log("checkpointStaged", step=step, stallSeconds=round(stall, 6))

    def _save_now(self, step: int, precision: str, capture: Callable[[], dict[str, Any]]) -> None:
        self.collect(block=True, training_step=step)
        staged = self.staging.stage(capture())
        try:
            staged.ready()
            result = self.store.write(step, precision, staged.state)
        except Exception as exc:
            self._failed(step, step, exc)
            raise  # no final checkpoint: this attempt cannot claim success
        self._saved(result, asynchronous=False)

    def collect(self, *, block: bool, training_step: int) -> SaveResult | None:
        """Report a finished asynchronous save (waiting for it with `block`), or its failure;
        returns what was written, if anything."""
        if block:
            self.before_update()
        try:
            result = self.writer.wait() if block else self.writer.poll()
        except WriteFailed as failed:
            self._failed(failed.step, training_step, failed.cause)
            return None
        if result is not None:
            self._saved(result, asynchronous=True)
        return result

    def settle(self, training_step: int) -> None:
        """At the end of the attempt, and before an fp32 replay picks the last good checkpoint:
        wait for the save in flight and report it (never raises: the attempt's ending is decided
        by what it knows already)."""
        if self.world.is_main or self.sharded:
            with contextlib.suppress(Exception):
                self.collect(block=True, training_step=training_step)

    def _failed(self, step: int, training_step: int, exc: BaseException) -> None:
        self.metrics.checkpoint_failures.inc()
        self.failures += 1
        error = f"{type(exc).__name__}: {exc}"
        self.log("checkpointFailed", step=step, trainingStep=training_step, error=error, failures=self.failures)

    def _saved(self, result: SaveResult, asynchronous: bool) -> None:
        """A save is durable: its checkpoint is the last good one; report it."""
        self._trust(result.ref)
        self.metrics.checkpoint_seconds.observe(result.seconds)
        self.metrics.checkpoint_bytes.set(result.bytes)
        self.log(
            "checkpoint",
            step=result.ref.step,
            path=result.ref.path,
            sha256=result.ref.sha256,
            seconds=round(result.seconds, 4),
            bytes=result.bytes,
            **{"async": asynchronous},
        )
        if result.housekeeping is not None:  # the checkpoint stands; the next save's housekeeping tries again
            self.log("checkpointHousekeepingFailed", step=result.ref.step, problem=result.housekeeping)
