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
bf16), max_steps, devices from the launcher's environment, the spec's clip norm and
accumulation, no checkpointing of its own, and MpjobCallback. `fit` resumes through
`Trainer.fit(ckpt_path=...)` from the attempt's checkpoint: weights, optimizers, LR
schedulers, the scaler, loops (global step) and callbacks, as Lightning saved them.

The session runs Lightning's step itself for the fp32 replay and the quality gate
(adapters.replaying): the callback keeps the last steps' batches as Lightning fed them, the
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
import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.data import extract_batch_size

from mpjob_trainer.adapters.mixed import framework_precision
from mpjob_trainer.adapters.quarantined import TakenBack
from mpjob_trainer.adapters.reload import LIGHTNING_CHECKPOINT, lightning_reader
from mpjob_trainer.adapters.replaying import FrameworkWeights, RecordedSteps, loss_of, steps_to_keep, weights_finite
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.session.framework import FrameworkRun
from mpjob_trainer.session.outcomes import RolledBack

CHECKPOINT = LIGHTNING_CHECKPOINT
PRECISION = {"bf16": "bf16-mixed", "fp32": "32-true"}


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


class MpjobCallback(L.Callback):
    """Closes each optimizer step in the session: guard, progress, checkpoint decision, SIGTERM.
    Losses stay on the device (no sync per step); steps are Lightning's global steps."""

    def __init__(self, run: Session) -> None:
        self.run = run
        self.bridge = FrameworkRun(run)
        self._loss: torch.Tensor | None = None
        self._samples = 0
        self._step = 0
        self._registered = False
        self.recorded = RecordedSteps(steps_to_keep(run.spec))
        self.optimizers: list[torch.optim.Optimizer] = []  # Lightning's, once fit has made them
        self.quarantined = TakenBack(self.bridge, lambda: list(self.optimizers))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bridge.reclaim_sigterm()  # Lightning would stop at its next batch, without a checkpoint
        for optimizer in trainer.optimizers:
            self.bridge.watch(optimizer)
        self.optimizers = list(trainer.optimizers)
        self._step = trainer.global_step
        self._registered = False
        self._loss, self._samples = None, 0  # a re-entry after a rollback: the left step is gone
        self.recorded.clear()
        self.bridge.checkpoint_start()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.recorded.add(trainer.global_step, batch)
        if not self._registered:  # the step runs on recorded batches: now there is one
            self._registered = True
            register(self.run, trainer, pl_module, self.recorded)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and not self.quarantined.skips(self._step):  # a quarantined step's is 0
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else self._loss + loss
        self._samples += extract_batch_size(batch)
        if trainer.global_step == self._step:
            return  # accumulating gradients: no optimizer step yet
        self._step = trainer.global_step
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        loss, samples, self._loss, self._samples = self._loss, self._samples * self.run.world.size, None, 0
        self.quarantined.take_back()  # before the session may checkpoint this step
        self.bridge.end_step(trainer.global_step, loss=loss, samples=samples, lr=lr)


def trainer_settings(run: Session, **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for `lightning.Trainer` that train this attempt; `kwargs` are the
    script's other arguments (its `callbacks` and `plugins` are kept, after mpjob's)."""
    owned = {"precision", "max_steps", "enable_checkpointing", "accelerator", "devices", "num_nodes"}
    clash = sorted(set(kwargs) & owned)
    if clash:
        raise ConfigError(
            f"trainer_settings({', '.join(clash)}=...): set by the attempt (precision, spec.training.steps, "
            "the launcher's processes, checkpoints by mpjob); change the job's spec instead"
        )
    tr = run.spec.training
    callback = MpjobCallback(run)
    mixed = framework_precision(run.precision)
    measured = run.launch.precision == "auto"  # may settle on any precision once fit has begun
    plugins: list[Any] = [SessionAutocast(run)] if mixed != "fp32" or measured else []
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    settings: dict[str, Any] = {
        "max_steps": run.total_steps,
        "accelerator": "gpu" if run.device.type == "cuda" else "cpu",
        "devices": local,
        "num_nodes": max(1, run.world.size // local),
        "enable_checkpointing": False,
        "gradient_clip_val": tr.grad_clip_norm or None,
        "accumulate_grad_batches": tr.grad_accumulation,
        "log_every_n_steps": tr.log_every,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
        **({} if plugins else {"precision": PRECISION[mixed]}),
    }
    settings.update(kwargs)
    settings["callbacks"] = [callback, *_listed(kwargs.get("callbacks"))]
    settings["plugins"] = [*plugins, *_listed(kwargs.get("plugins"))]
    return settings


def _listed(given: Any) -> list[Any]:
    """Lightning's `callbacks` and `plugins`: one, or a list of them, or None."""
    return [] if given is None else list(given) if isinstance(given, list | tuple) else [given]


def register(run: Session, trainer: L.Trainer, module: L.LightningModule, recorded: RecordedSteps) -> None:
    """Give the session Lightning's step (fp32 replay; an `auto` attempt's measurement) and
    evaluation (quality gate). Called at the first micro-batch of the first step, before
    Lightning trains on it: an `auto` attempt measures on that batch there (session.measure),
    the one point inside `fit` where no gradient has been accumulated that the step's
    zero_grad would drop."""
    if len(trainer.optimizers) != 1:
        return  # manual optimization with several optimizers: no one step to re-run
    optimizer, clip = trainer.optimizers[0], float(trainer.gradient_clip_val or 0) or None
    by_value = trainer.gradient_clip_algorithm == "value"  # else by norm, Lightning's default

    def step(index: int) -> None:
        batches = recorded.batches(index)
        weights_finite(module.parameters())
        optimizer.zero_grad(set_to_none=True)  # the faulting step's gradients are still there
        with recorded.paused(), clipping_values(optimizer, clip if by_value else None):
            for k, batch in enumerate(batches):
                run.backward(loss_of(trainer.strategy.training_step(batch, k)) / len(batches))
            run.step(optimizer, clip_norm=None if by_value else clip)

    weights = FrameworkWeights(module.parameters, lightning_reader(module, optimizer))
    run.register_step(step, modules=[module], weights=weights)
    if run.spec.validation.every_steps:
        run.evaluate_with(lambda: evaluate(run, trainer, module))


@contextlib.contextmanager
def clipping_values(optimizer: torch.optim.Optimizer, value: float | None) -> Iterator[None]:
    """In the block, the optimizer's step first clips each gradient element to [-value, value], as
    Lightning's `gradient_clip_algorithm="value"` does: after `run.step` unscaled them and measured
    their norm (the reported one, before clipping), and only for a step GradScaler takes."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    clip = (lambda *_: torch.nn.utils.clip_grad_value_(params, value)) if value else (lambda *_: None)
    hook = optimizer.register_step_pre_hook(clip)
    try:
        yield
    finally:
        hook.remove()


def evaluate(run: Session, trainer: L.Trainer, module: L.LightningModule) -> float:
    """Mean `validation_step` loss over the first validation.batches batches of `val_dataloader()`,
    under the session's autocast (the gate runs it in the attempt's precision and in fp32)."""
    if type(module).validation_step is L.LightningModule.validation_step:
        raise ConfigError("validation.everySteps is set but the LightningModule has no validation_step")
    module.eval()
    try:
        losses = []
        for k, batch in enumerate(itertools.islice(module.val_dataloader(), run.spec.validation.batches)):
            with run.autocast():
                losses.append(float(loss_of(module.validation_step(trainer.strategy.batch_to_device(batch), k))))
    finally:
        module.train()
    if not losses:
        raise ConfigError("validation.everySteps is set but the LightningModule's val_dataloader() is empty")
    return sum(losses) / len(losses)


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
    bridge = callback.bridge

    def write(staging: Path) -> Path:
        trainer.save_checkpoint(staging / CHECKPOINT)  # every rank calls it; rank 0 writes
        return staging

    bridge.checkpoint_with(write, model.parameters)
    run.keep_fp32(model)
    point = bridge.resume()
    if point.done:  # the last step's checkpoint: nothing left to fit
        return
    ckpt = str(point.framework_checkpoint / CHECKPOINT) if point.framework_checkpoint else None
    with quarantined_steps(model, callback.quarantined):
        while True:
            try:
                trainer.fit(model, ckpt_path=ckpt, **fit_kwargs)
                return
            except RolledBack as back:
                ckpt = str(bridge.reentry(back) / CHECKPOINT)
