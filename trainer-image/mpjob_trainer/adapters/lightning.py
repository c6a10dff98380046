"""PyTorch Lightning as a mpjob attempt (extra `mpjob-trainer[lightning]`).

    import lightning as L
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    with mpjob.start() as run:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False))
        mpjob_lightning.fit(run, trainer, model, train_dataloaders=loader)

`trainer_settings` turns the attempt into Trainer arguments: the precision (`"bf16-mixed"`,
also around an fp8 attempt's float8 linears (adapters.mixed), `"32-true"`; fp16 as a
`MixedPrecision` plugin that carries the attempt's GradScaler, so the spec's loss-scale
settings hold and fp16 also runs on a CPU, where `precision="16-mixed"` silently becomes
bf16), max_steps, devices from the launcher's environment, the spec's clip norm, the attempt's
accumulation (a script's own must be the job's or the attempt's: adapters.spec_settings), no
checkpointing of its own unless the script gives a `ModelCheckpoint` (its output, written to its
`dirpath`, which must not be mpjob's checkpoint folder: adapters.own_saves), and MpjobCallback
(adapters.lightning_callback: it also holds the DataLoader's batches to the attempt's micro-batch).
`fit` resumes through `Trainer.fit(ckpt_path=...)` from the attempt's checkpoint: weights,
optimizers, LR schedulers, the scaler, loops (global step; the epoch's micro-batches counted in the
attempt's split: adapters.lightning_callback.in_this_split) and callbacks (a ModelCheckpoint's best
model, an EarlyStopping's patience), as Lightning saved them once done with the step, its
validation there included (adapters.lightning_callback.closed_after_validation).

The session runs Lightning's step itself for the fp32 replay and the quality gate
(adapters.lightning_step): the callback keeps the last steps' batches as Lightning fed them, the
step re-runs `training_step` through the strategy (DDP's gradient sync as in training) under
the session's autocast, which the precision plugin (SessionAutocast) follows in every mode,
and the gate evaluates the module's `validation_step` on its `val_dataloader()`. An `auto`
attempt measures its precision with that step on the first batch (session.measure) and
settles on the one chosen inside `fit`: the plugin reads the session's autocast and scaler at
each use, so Lightning trains that first batch in it already.

Bad data (guard.onBadData skip) and loss spikes (guard.spike): the session rolls its own state
back (RNG included: Lightning saves none) and RolledBack leaves `Trainer.fit`; `fit` calls it
again from that checkpoint. A quarantined step trains on nothing (adapters.quarantined): the
module's `training_step` runs no forward and returns a loss whose gradients are zero, and the
update Lightning makes from them is taken back at the step's end (Lightning's own skip, a
`training_step` that returns None, is refused under DDP). The batch is drawn as ever, so the
loader's position stays a function of the global step.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.plugins.precision import MixedPrecision, Precision

from mpjob_trainer.adapters.lightning_callback import MpjobCallback, closed_after_validation
from mpjob_trainer.adapters.mixed import framework_precision
from mpjob_trainer.adapters.quarantined import TakenBack
from mpjob_trainer.adapters.reload import LIGHTNING_CHECKPOINT, lightning_finished
from mpjob_trainer.adapters.spec_settings import attempt_shape, spec_name
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.session.outcomes import RolledBack

CHECKPOINT = LIGHTNING_CHECKPOINT
PRECISION = {"bf16": "bf16-mixed", "fp32": "32-true"}
#: Lightning's accumulation -> the spec.training field that is the job's (adapters.spec_settings).
ACCUMULATION = {"accumulate_grad_batches": "grad_accumulation"}


class SessionAutocast(MixedPrecision):
    """Lightning's mixed precision whose autocast is the session's current mode's: the attempt's
    in training, none while the session replays or evaluates in fp32 (session.modes).

    Lightning files a precision plugin's state (the scaler) in its checkpoint under the class's
    `__qualname__`: this one keeps MixedPrecision's, so the checkpoints are those of a plain
    MixedPrecision, and earlier ones resume with their scaler."""

    __qualname__ = "MixedPrecision"

    def __init__(self, run: Session) -> None:
        self.run = run  # before MixedPrecision's __init__, which sets `scaler`
        fp16 = framework_precision(run.precision) == "fp16"
        mixed: Literal["16-mixed", "bf16-mixed"] = "16-mixed" if fp16 else "bf16-mixed"
        super().__init__(mixed, run.device.type, scaler=run.scaler)

    @property  # type: ignore[override]
    def scaler(self) -> torch.amp.GradScaler | None:
        """The session's GradScaler at each use, not the one at construction: an `auto` attempt
        settles its precision (and a fresh scaler, or none) inside `fit`, after the plugin exists."""
        return self.run.scaler

    @scaler.setter
    def scaler(self, value: torch.amp.GradScaler | None) -> None:
        pass  # MixedPrecision's __init__ hands back the session's own: the session owns it

    @contextlib.contextmanager
    def forward_context(self) -> Iterator[None]:
        with self.run.autocast():
            yield


def trainer_settings(run: Session, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for `lightning.Trainer` that train this attempt; `kwargs` are the
    script's other arguments (its `callbacks` and `plugins` are kept, after mpjob's)."""
    owned = {"precision", "max_steps", "accelerator", "devices", "num_nodes"}
    clash = sorted(set(kwargs) & owned)
    if clash:
        raise ConfigError(
            f"trainer_settings({', '.join(clash)}=...): set by the attempt (precision, spec.training.steps, "
            "the launcher's processes); change the job's spec instead"
        )
    taken = _precision_plugins([*_listed(kwargs.get("callbacks")), *_listed(kwargs.get("plugins"))])
    if taken:
        raise ConfigError(
            f"trainer_settings(callbacks/plugins=[{', '.join(taken)}]): the attempt sets the precision "
            "(spec.precision); leave them out"
        )
    tr = run.spec.training
    callback = MpjobCallback(run)
    plugins: list[Any] = [SessionAutocast(run)] if _session_autocast(run) else []
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    settings: dict[str, Any] = {
        "max_steps": run.total_steps,
        "accelerator": "gpu" if run.device.type == "cuda" else "cpu",
        "devices": local,
        "num_nodes": max(1, run.world.size // local),
        # Lightning refuses a ModelCheckpoint without it, and adds one of its own with it
        "enable_checkpointing": any(isinstance(c, Checkpoint) for c in _listed(kwargs.get("callbacks"))),
        "gradient_clip_val": tr.grad_clip_norm or None,
        "accumulate_grad_batches": tr.grad_accumulation,
        "log_every_n_steps": tr.log_every,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
        **({} if plugins else {"precision": PRECISION["fp32"]}),
    }
    settings.update(kwargs)
    settings.update(attempt_shape(run, kwargs, ACCUMULATION, "trainer_settings"))
    settings["callbacks"] = [callback, *_listed(kwargs.get("callbacks"))]
    settings["plugins"] = [*plugins, *_listed(kwargs.get("plugins"))]
    return settings


def _session_autocast(run: Session) -> bool:
    """Does the attempt train under SessionAutocast? Mixed precision does, and so does an `auto`
    attempt, which may settle on any precision once fit has begun; fp32 is Lightning's "32-true"."""
    return framework_precision(run.precision) != "fp32" or run.launch.precision == "auto"


def _check(run: Session, trainer: L.Trainer) -> None:
    """A Trainer not built from trainer_settings(run) would train in a precision the attempt does
    not report (or without its GradScaler), or past its steps."""
    wrong: dict[str, Any] = {}
    if _session_autocast(run):
        if not isinstance(trainer.precision_plugin, SessionAutocast):
            wrong["precision"] = trainer.precision
    elif trainer.precision != PRECISION["fp32"]:
        wrong["precision"] = trainer.precision
    if trainer.max_steps != run.total_steps:
        wrong["max_steps"] = trainer.max_steps
    if wrong:
        raise ConfigError(
            f"the Trainer's settings disagree with the attempt ({run.precision}, {run.total_steps} steps): "
            f"{wrong}; build it with "
            "lightning.Trainer(**mpjob_trainer.adapters.lightning.trainer_settings(run, ...))"
        )


def _manual_optimization(run: Session, trainer: L.Trainer, model: L.LightningModule) -> None:
    """A module that optimizes by hand (`automatic_optimization = False`) steps in its own
    `training_step`, where Lightning clips and accumulates nothing: it refuses a Trainer with a
    `gradient_clip_val` or an `accumulate_grad_batches` above 1 at `fit` (an exception of no known
    kind, retried as an infrastructure failure). The clip norm (the spec's unless the script gave
    its own) is then the module's to apply, as its learning rate is: dropped, told on stderr. The
    samples per step cannot be the spec's under an accumulation: a ConfigError, which no retry helps."""
    if model.automatic_optimization:
        return
    accumulation, job = trainer.accumulate_grad_batches, run.launch.spec.training.grad_accumulation
    if accumulation != 1:
        split = f"; this attempt's split trains {accumulation}" if accumulation != job else ""
        raise ConfigError(
            f"{spec_name('grad_accumulation')} ({job}{split}): the LightningModule uses manual optimization "
            "(automatic_optimization=False), where Lightning accumulates no gradients; set it to 1 with a "
            f"{spec_name('batch_size')} of the samples per step, or optimize automatically"
        )
    clip, trainer.gradient_clip_val = trainer.gradient_clip_val, None
    if clip and run.world.rank == 0:
        print(
            f"mpjob: the LightningModule uses manual optimization, where Lightning clips no gradients: "
            f"gradient_clip_val={clip!r} ({spec_name('grad_clip_norm')}={run.spec.training.grad_clip_norm!r}) is "
            "left to your training_step: self.clip_gradients(optimizer, gradient_clip_val=..., "
            'gradient_clip_algorithm="norm") before its optimizer.step()',
            file=sys.stderr,
            flush=True,
        )


def _precision_plugins(given: list[Any]) -> list[str]:
    """The script's callbacks and plugins that would do the attempt's part: set the precision."""
    return [type(c).__name__ for c in given if isinstance(c, Precision)]


def _listed(given: Any) -> list[Any]:
    """Lightning's `callbacks` and `plugins`: one, or a list of them, or None."""
    return [] if given is None else list(given) if isinstance(given, list | tuple) else [given]


def _callback(trainer: L.Trainer) -> MpjobCallback:
    found = [c for c in trainer.callbacks if isinstance(c, MpjobCallback)]  # type: ignore[attr-defined]
    if not found:
        raise ConfigError("the Trainer has no MpjobCallback: build it with lightning.Trainer(**trainer_settings(run))")
    return found[0]


@contextlib.contextmanager
def quarantined_steps(module: L.LightningModule, taken: TakenBack) -> Iterator[None]:
    """In the block, the module's `training_step` runs no forward at a quarantined step and returns
    a loss whose gradients are zero; the callback takes the update back (adapters.quarantined).
    Manual optimization is left alone: its global step moves only when the module steps, so a
    skipped `training_step` would hold it at the quarantined step for good."""
    original = module.training_step

    def training_step(*args: Any, **kwargs: Any) -> Any:
        if module.automatic_optimization and taken.skips(module.trainer.global_step):
            return taken.zero_loss()
        return original(*args, **kwargs)

    module.training_step = training_step  # type: ignore[method-assign]
    try:
        yield
    finally:
        del module.training_step  # the class's again


def fit(run: Session, trainer: L.Trainer, model: L.LightningModule, **fit_kwargs: Any) -> None:
    """Train the attempt: `trainer.fit(model, ...)` from the attempt's checkpoint. After a rollback
    of the data rung (RolledBack) Lightning fits again from that checkpoint."""
    if "ckpt_path" in fit_kwargs:
        raise ConfigError("fit(ckpt_path=...): the attempt names the checkpoint to resume from")
    callback = _callback(trainer)
    _check(run, trainer)
    shape = attempt_shape(run, {"accumulate_grad_batches": trainer.accumulate_grad_batches}, ACCUMULATION, "Trainer")
    trainer.accumulate_grad_batches = shape["accumulate_grad_batches"]  # Lightning reads it at every batch
    _manual_optimization(run, trainer, model)
    bridge = callback.bridge

    def write(staging: Path) -> Path:
        trainer.save_checkpoint(staging / CHECKPOINT)  # every rank calls it; rank 0 writes
        return staging

    bridge.checkpoint_with(write, model)
    run.keep_fp32(model)
    point = bridge.resume()
    ckpt = str(point.framework_checkpoint / CHECKPOINT) if point.framework_checkpoint else None
    if point.done:  # the last step's checkpoint: nothing left to fit; as after fit (weights, callbacks, progress)
        load, callbacks = trainer.strategy.load_checkpoint, trainer.callbacks  # type: ignore[attr-defined]
        bridge.read_last(point, lambda folder: lightning_finished(model, callbacks, folder, load, trainer.fit_loop))
        return
    with quarantined_steps(model, callback.quarantined), closed_after_validation(trainer, callback):
        while True:
            try:
                trainer.fit(model, ckpt_path=ckpt, **fit_kwargs)
                return
            except RolledBack as back:
                ckpt = str(bridge.reentry(back) / CHECKPOINT)
