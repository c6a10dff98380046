"""The bare AMP update the benchmarks measure the trainer against (nanoGPT's loop): scaled
backward, unscale, clip at 1.0, step, update the scale, clear the gradients."""

from __future__ import annotations

import torch


def amp_update(
    loss: torch.Tensor, model: torch.nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> None:
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
