"""The baseline the benchmarks measure the trainer against: nanoGPT's training loop.

`amp_update` is its update (scaled backward, unscale, clip at 1.0, step, update the scale,
clear the gradients); `NanoGPTLoop` is the whole step of nanoGPT's train.py around a task's
model: the model torch.compile'd, AdamW fused on CUDA with nanoGPT's weight-decay groups,
random windows pinned and copied asynchronously, the next batch fetched while the forward
pass runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from mpjob_contract.api import Training

#: The trainer's defaults (spec.training), so both loops train with the same hyperparameters.
DEFAULTS = Training()
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def amp_update(
    loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> None:
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)


def nanogpt_optimizer(model: nn.Module, device: torch.device) -> torch.optim.AdamW:
    """nanoGPT's configure_optimizers: weight decay on the tensors of matmuls and embeddings
    (dim >= 2) only, none on biases and LayerNorm; the fused AdamW kernel on CUDA."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": DEFAULTS.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=DEFAULTS.learning_rate, betas=(0.9, 0.95), fused=device.type == "cuda")


def random_batches(dataset: Dataset[Any], batch: int, device: torch.device) -> Iterator[tuple[torch.Tensor, ...]]:
    """nanoGPT's get_batch over a map-style dataset: `batch` random windows, pinned and copied
    without waiting on CUDA."""
    gen = torch.Generator().manual_seed(0)
    size = len(dataset)  # type: ignore[arg-type]
    while True:
        picked = [dataset[i] for i in torch.randint(size, (batch,), generator=gen).tolist()]
        pair = tuple(torch.stack(column) for column in zip(*picked, strict=True))
        if device.type == "cuda":
            pair = tuple(t.pin_memory().to(device, non_blocking=True) for t in pair)
        yield pair


class NanoGPTLoop:
    """One training step of nanoGPT's train.py over `model` (fp32 weights, on `device`)."""

    def __init__(
        self, model: nn.Module, loss: Any, data: Iterator[tuple[torch.Tensor, ...]], *, precision: str, compiled: bool
    ) -> None:
        self.model = model
        self.loss = loss
        self.device = next(model.parameters()).device
        self.net = torch.compile(model) if compiled else model
        self.optimizer = nanogpt_optimizer(model, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision == "fp16")
        self.dtype = DTYPES.get(precision)
        self.data = data
        self.batch = next(data)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def step(self) -> None:
        for group in self.optimizer.param_groups:  # nanoGPT sets its schedule's lr every step
            group["lr"] = DEFAULTS.learning_rate
        inputs, targets = self.batch
        with self.autocast():
            loss = self.loss(self.net(inputs), targets)
        self.batch = next(self.data)  # fetched while the device runs the forward pass
        amp_update(loss, self.model, self.optimizer, self.scaler)
