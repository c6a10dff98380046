"""PyTorch Lightning as a mpjob attempt (extra `mpjob-trainer[lightning]`).

    import lightning as L
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    with mpjob.start() as run:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False))
        mpjob_lightning.fit(run, trainer, model, train_dataloaders=loader)

`trainer_settings` turns the attempt into Trainer arguments: the precision (`"bf16-mixed"`,
`"32-true"`; fp16 as a `MixedPrecision` plugin that carries the attempt's GradScaler, so the
spec's loss-scale settings hold and fp16 also runs on a CPU, where `precision="16-mixed"`
silently becomes bf16), max_steps, devices from the launcher's environment, the spec's clip
norm and accumulation, no checkpointing of its own, and MpjobCallback. `fit` resumes
through `Trainer.fit(ckpt_path=...)` from the attempt's checkpoint: weights, optimizers,
LR schedulers, the scaler, loops (global step) and callbacks, as Lightning saved them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.utilities.data import extract_batch_size

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.session.framework import FrameworkRun

CHECKPOINT = "lightning.ckpt"
PRECISION = {"bf16": "bf16-mixed", "fp32": "32-true"}


class MpjobCallback(L.Callback):
    """Closes each optimizer step in the session: guard, progress, checkpoint decision, SIGTERM.
    Losses stay on the device (no sync per step); steps are Lightning's global steps."""

    def __init__(self, run: Session) -> None:
        self.run = run
        self.bridge = FrameworkRun(run)
        self._loss: torch.Tensor | None = None
        self._samples = 0
        self._step = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.bridge.reclaim_sigterm()  # Lightning would stop at its next batch, without a checkpoint
        for optimizer in trainer.optimizers:
            self.bridge.watch(optimizer)
        self._step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float()
            self._loss = loss if self._loss is None else self._loss + loss
        self._samples += extract_batch_size(batch)
        if trainer.global_step == self._step:
            return  # accumulating gradients: no optimizer step yet
        self._step = trainer.global_step
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        loss, samples, self._loss, self._samples = self._loss, self._samples * self.run.world.size, None, 0
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
    plugins: list[Any] = []
    if run.precision == "fp16":
        plugins.append(MixedPrecision("16-mixed", run.device.type, scaler=callback.bridge.scaler))
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
        **({} if plugins else {"precision": PRECISION[run.precision]}),
    }
    settings.update(kwargs)
    settings["callbacks"] = [callback, *kwargs.get("callbacks", [])]
    settings["plugins"] = [*plugins, *kwargs.get("plugins", [])]
    return settings


def _callback(trainer: L.Trainer) -> MpjobCallback:
    found = [c for c in trainer.callbacks if isinstance(c, MpjobCallback)]  # type: ignore[attr-defined]
    if not found:
        raise ConfigError("the Trainer has no MpjobCallback: build it with lightning.Trainer(**trainer_settings(run))")
    return found[0]


def fit(run: Session, trainer: L.Trainer, model: L.LightningModule, **fit_kwargs: Any) -> None:
    """Train the attempt: `trainer.fit(model, ...)` from the attempt's checkpoint."""
    if "ckpt_path" in fit_kwargs:
        raise ConfigError("fit(ckpt_path=...): the attempt names the checkpoint to resume from")
    bridge = _callback(trainer).bridge

    def write(staging: Path) -> Path:
        trainer.save_checkpoint(staging / CHECKPOINT)  # every rank calls it; rank 0 writes
        return staging

    bridge.checkpoint_with(write, model.parameters)
    run.keep_fp32(model)
    point = bridge.resume()
    if point.done:  # the last step's checkpoint: nothing left to fit
        return
    ckpt = str(point.framework_checkpoint / CHECKPOINT) if point.framework_checkpoint else None
    trainer.fit(model, ckpt_path=ckpt, **fit_kwargs)
