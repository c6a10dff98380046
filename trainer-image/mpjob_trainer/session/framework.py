"""FrameworkRun: a Session driven by a training framework's callback instead of a loop.

A framework (Hugging Face Trainer, Lightning) owns the loop: it builds the optimizer, runs
autocast, scales the loss, steps, and writes and reads its own checkpoints. mpjob's framework
adapters (mpjob_trainer.adapters) must still keep every promise a Session keeps, and keep it
the same way, so they do not reimplement any of it; they reach the session through this:

- the attempt's GradScaler (`scaler`), built from spec.precision.lossScale, is handed to the
  framework as *its* scaler: the guard reads the very scaler that skips steps;
- `watch(optimizer)` hooks the framework's optimizer like `Session.step` hooks a loop's, so
  overflow-skipped steps are known on the host with no extra sync;
- `end_step` is the loop's `end_step`: guard, progress, checkpoint decision, preemption;
- checkpoints: when the session decides to save (a healthy interval), the framework writes
  its own checkpoint into a staging folder and the CheckpointStore adopts it (sha256 of
  every file in the manifest, keep-K, corrupt ones skipped on load) beside a small state.pt
  with what the session owns (step, applied steps, scaler, RNG); in a bucket, whose staging
  is each rank's own spool, the other ranks' files go up into it first (checkpoint.rank_files);
- `resume()` loads the attempt's checkpoint like `Session.resume` and says where the
  framework's own checkpoint lies, for `resume_from_checkpoint` / `ckpt_path`;
- bad data and loss spikes (the data rung, session.skipping): the framework cannot be rolled
  back in place, so the session re-enters it (`Session.reenter_on_rollback`): on a data verdict
  the session rolls its own state back, quarantines the step whole and raises RolledBack out
  of `end_step`; the adapter lets it leave the framework's loop and calls the framework again
  from `reentry()`'s checkpoint, training on nothing at the steps `skips()` names.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from mpjob_contract.report import CheckpointRef
from mpjob_trainer import distributed as dist_env
from mpjob_trainer.checkpoint import CorruptCheckpoint, rank_files, snapshot, unloadable
from mpjob_trainer.checkpoint.peers import Peers
from mpjob_trainer.checkpoint.protocol import Store
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.session.agreement import main_says
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.outcomes import RolledBack
from mpjob_trainer.session.run import Session
from mpjob_trainer.session.state import TrainingState, all_finite, model_tensors


class CheckpointWriter(Protocol):
    """Has the framework write its checkpoint into `staging` (called on every rank: frameworks
    save collectively); returns the folder it wrote, inside `staging`."""

    def __call__(self, staging: Path) -> Path: ...


@dataclass(frozen=True)
class ResumePoint:
    step: int
    #: The framework's checkpoint inside the attempt's mpjob checkpoint; None on a fresh start.
    framework_checkpoint: Path | None
    #: The checkpoint is of the last step, or of the step the framework stopped early after (a
    #: retry after a crash past the final checkpoint): nothing is left to train, and a framework
    #: asked to would still train one more step (forgetting its stop: session.early_stop).
    done: bool = False


class FrameworkCheckpointer(Checkpointer):
    """Checkpoints the framework writes and the store adopts, on the session's decision."""

    def __init__(self, base: Checkpointer, write: CheckpointWriter, model: torch.nn.Module):
        super().__init__(base.store, base.world, base.log, base.metrics)
        self.last_good = base.last_good  # it takes over from `base`, what it knows included
        self.write = write
        self.model = model

    def finite(self, state: TrainingState) -> bool:
        """Is what the framework's checkpoint holds of its model finite, its buffers included
        (state.model_tensors, state.all_finite: the SDK's rule)? The session's `state` holds no model."""
        return all_finite(model_tensors([self.model], state.tensors()))

    def reserve(self, capture: Callable[[], dict[str, Any]]) -> None:
        """Nothing: a framework's save is synchronous and stages nothing (no buffers to hold)."""

    def save(self, step: int, precision: str, capture: Callable[[], dict[str, Any]], *, final: bool) -> None:
        """Framework save, then adoption on rank 0; synchronous (the framework's save is)."""
        # rank 0's name, on every rank: no other trainer's staging (another attempt's, saving this step) has it
        staging = self.store.root / main_says(f".tmp-framework-{step:09d}-{secrets.token_hex(6)}", self.world)
        if self.world.is_main:
            staging = self.store.staging(staging.name)
        dist_env.barrier(self.world)
        written = self.write(staging)
        # Every rank has written before the folder is adopted (moved): a framework's save is
        # not one collective, and a rank writes its own files (the HF Trainer's RNG state) last.
        dist_env.barrier(self.world)
        joined = rank_files.join(self.store, step, staging, written, Peers.current())  # a bucket's: in its own spools
        if self.world.is_main:
            try:
                result = rank_files.write(self.store, step, precision, snapshot(capture()), written, joined)
            except Exception as exc:
                self._failed(step, step, exc)
                if final:
                    raise  # no final checkpoint: this attempt cannot claim success
            else:
                self._saved(result, asynchronous=False)
            finally:  # what `written` left of it (the HF Trainer writes a folder inside), or a failed save's files
                shutil.rmtree(staging, ignore_errors=True)
        dist_env.barrier(self.world)


def framework_folder(store: Store[Any], ref: CheckpointRef) -> Path:
    """The framework's own checkpoint inside the mpjob checkpoint `ref` of `store`, a folder on
    this machine (a bucket's: downloaded by the verify that preceded its load)."""
    folder = store.framework_folder(ref)
    if not folder.is_dir():
        raise ConfigError(
            f"the checkpoint of step {ref.step} ({ref.path}) holds no framework checkpoint: it was not "
            "written through a framework adapter, so this script cannot resume from it"
        )
    return folder


class FrameworkRun:
    """The adapter's handle on a Session (see the module docstring): only the Session's public
    hooks (`scaler`, `checkpoints` / `checkpoint_with`, `watch`, `end_step(lr=)`, `preemption`,
    `quarantined`, `reenter_on_rollback`)."""

    def __init__(self, run: Session) -> None:
        self.run = run
        run.reenter_on_rollback()
        run.framework_numbers_steps()  # its global step: Lightning's counts each optimizer's step

    def checkpoint_with(self, write: CheckpointWriter, model: torch.nn.Module) -> None:
        """From now on the session's checkpoints are the framework's (`write`), adopted; a `model`
        whose weights or buffers are not finite is never saved: the precision ends there."""
        base = self.run.checkpoints
        if not isinstance(base, FrameworkCheckpointer):
            self.run.checkpoint_with(FrameworkCheckpointer(base, write, model))

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The attempt's GradScaler (fp16 only), for the framework to scale and step with."""
        return self.run.scaler

    def resume(self) -> ResumePoint:
        """Load the attempt's checkpoint (launch.resumeFrom, else the newest valid one)."""
        step = self.run.resume()
        ref = self.run.checkpoints.last_good
        if step == 0 or ref is None:
            return ResumePoint(0, None)
        return ResumePoint(step, framework_folder(self.run.checkpoints.store, ref), done=self.run.finished)

    def read_last(self, point: ResumePoint, read: Callable[[Path], None]) -> None:
        """`read` the framework's checkpoint of the last step (`point.done`: nothing is left to
        train) into the live objects, as after training (the script may save or evaluate them). One
        bad inside (`read` raises CorruptCheckpoint: adapters.reload) is the checkpoint's fault: it
        is rejected and marked unloadable before the error goes on (an InfraError), so the next
        attempt resumes from the one before it and trains the last steps again."""
        assert point.done and point.framework_checkpoint is not None
        try:
            read(point.framework_checkpoint)
        except CorruptCheckpoint as exc:
            store: Store[Any] = self.run.checkpoints.store  # a volume's places or a bucket's
            ref = self.run.checkpoints.last_good
            where = store.named(ref.path) if ref is not None else None
            if ref is not None and where is not None:
                self.run.checkpoints.log("checkpointRejected", path=str(where), problem=str(exc))
                unloadable.remember(store, where, ref.sha256)
            raise

    def reentry(self, back: RolledBack) -> Path:
        """The framework checkpoint to re-enter from after the data rung rolled the session back."""
        return framework_folder(self.run.checkpoints.store, back.ref)

    def checkpoint_start(self) -> None:
        """At a fresh start, the framework checkpoints step 0 (Session.checkpoint_start): what a
        rollback before the first interval's checkpoint re-enters from."""
        self.run.checkpoint_start()

    def skips(self, step: int) -> bool:
        """Is optimizer step `step` (0-based) quarantined whole? The framework trains nothing there."""
        return self.run.quarantined.skips_step(step)

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook the optimizer the framework steps (inside its wrapper, if any): GradScaler calls
        its step() only for finite gradients, which tells the guard of skipped steps."""
        self.run.watch(getattr(optimizer, "optimizer", optimizer))

    def stop_early(self, step: int) -> None:
        """The framework stops after step `step`, short of spec.training.steps (an early-stopping
        callback, its time limit): that step's checkpoint records it (Session.stop_early)."""
        self.run.stop_early(step)

    def end_step(
        self,
        step: int,
        *,
        loss: torch.Tensor | float | None,
        samples: int | None,
        lr: float | None,
        grad_norm: torch.Tensor | float | None = None,
        loss_samples: int | None = None,
    ) -> None:
        """Close optimizer step `step` as a loop's `end_step` does (`grad_norm`: the framework's,
        before clipping, unscaled, where it tells it; `loss_samples`: this rank's samples of the
        step, which weigh its loss in the job's, the framework running backward). A numeric fault ends the run
        here, inside the framework's loop: its fp32 replay needs the loop whole (Lightning unwraps
        DDP and moves the model off the device once the fault leaves it); the fault then goes on
        up, and the session's later close() returns the exit code decided here."""
        try:
            self.run.end_step(step, loss=loss, samples=samples, lr=lr, grad_norm=grad_norm, loss_samples=loss_samples)
        except NumericFault as fault:
            self.run.close(fault)
            raise

    def reclaim_sigterm(self) -> None:
        """Take SIGTERM back from a framework that installed its own handler (Lightning stops
        at its next batch without a checkpoint): the session decides when to stop."""
        self.run.preemption.reclaim()
