"""Checkpointer: when and by whom checkpoints are written, and what a failed write costs.

Every rank reaches the same step boundary; rank 0 stages the state there into reusable host
buffers (StagingBuffers: device copies issued, not awaited) and CheckpointStore writes and
hashes it off the training thread once the copies have landed. The training thread waits
for the previous save only when the next one is due (its buffers are about to be refilled),
so a save costs it the wait, the capture and the issuing of the copies: that stall is
logged (`checkpointStaged`) and observed (mpjob_trainer_checkpoint_stall_seconds).
The final checkpoint (end of training, or preemption) is written on the training thread and
every rank waits for it at a barrier: the attempt may not claim success, or exit 44, before
it is durable. A failed asynchronous write is counted and logged and training goes on: the
last good checkpoint stays the previous one and the next interval tries again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from mpjob_contract.report import CheckpointRef
from mpjob_trainer import distributed as dist_env
from mpjob_trainer.checkpoint import CheckpointStore, SaveResult, StagingBuffers
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics


class Checkpointer:
    def __init__(self, store: CheckpointStore, world: World, log: EventLog, metrics: TrainerMetrics) -> None:
        self.store = store
        self.world = world
        self.log = log
        self.metrics = metrics
        self.failures = 0
        self.staging = StagingBuffers()

    @property
    def last_good(self) -> CheckpointRef | None:
        return self.store.last_good

    def save(self, step: int, precision: str, capture: Callable[[], dict[str, Any]], *, final: bool) -> None:
        """Checkpoint the state `capture` returns at `step`; call on every rank."""
        if self.world.is_main:
            if final:
                self._save_now(step, precision, capture)
            else:
                self._save_async(step, precision, capture)
        if final:
            dist_env.barrier(self.world)

    def _save_async(self, step: int, precision: str, capture: Callable[[], dict[str, Any]]) -> None:
        """Stage now, write in the background; log how long the training thread was held."""
        start = time.perf_counter()
        self.collect(block=True, training_step=step)  # the previous write is done: buffers are free
        staged = self.staging.stage(capture())
        self.store.save_async(step, precision, staged.state, ready=staged.ready)
        stall = time.perf_counter() - start
        self.metrics.checkpoint_stall.observe(stall)
        self.log("checkpointStaged", step=step, stallSeconds=round(stall, 6))

    def _save_now(self, step: int, precision: str, capture: Callable[[], dict[str, Any]]) -> None:
        self.collect(block=True, training_step=step)
        staged = self.staging.stage(capture())
        try:
            staged.ready()
            result = self.store.save(step, precision, staged.state)
        except Exception as exc:
            self._failed(step, step, exc)
            raise  # no final checkpoint: this attempt cannot claim success
        self._saved(result, asynchronous=False)

    def collect(self, *, block: bool, training_step: int) -> None:
        """Report a finished asynchronous save (waiting for it with `block`), or its failure."""
        try:
            result = self.store.wait() if block else self.store.poll()
        except Exception as exc:
            self._failed(self.store.pending_step, training_step, exc)
            return
        if result is not None:
            self._saved(result, asynchronous=True)

    def _failed(self, step: int, training_step: int, exc: Exception) -> None:
        self.metrics.checkpoint_failures.inc()
        self.failures += 1
        self.log(
            "checkpointFailed",
            step=step,
            trainingStep=training_step,
            error=f"{type(exc).__name__}: {exc}",
            failures=self.failures,
        )

    def _saved(self, result: SaveResult, asynchronous: bool) -> None:
        self.metrics.checkpoint_seconds.observe(result.seconds)
        self.metrics.checkpoint_bytes.set(result.bytes)
        self.metrics.last_good_step.set(result.ref.step)
        self.log(
            "checkpoint",
            step=result.ref.step,
            path=result.ref.path,
            sha256=result.ref.sha256,
            seconds=round(result.seconds, 4),
            bytes=result.bytes,
            **{"async": asynchronous},
        )
