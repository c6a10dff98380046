"""What keeps Tensor Cores busy, for the builtin loop and your own loop alike (run.compile, run.adamw).

- `compile_model`: torch.compile of the model as spec.training.compile says. `auto` compiles on
  CUDA devices only, where the fused kernels pay for the compile time, and falls back to eager
  when compilation fails (torch._dynamo's suppress_errors); `always` compiles on any device and
  a compile failure ends the attempt as a configuration error (exit 43): retrying the same
  image cannot fix it. Compile after run.keep_fp32 (its wrapped forwards trace without graph
  breaks) and before run.wrap, and hand the *uncompiled* module to run.resume, so checkpoint
  keys stay the module's own (no `_orig_mod.` prefix).
- `adamw`: AdamW with nanoGPT's weight-decay rule (parameters with 2 or more dimensions,
  the matrices and embeddings, decay; biases and norm gains do not) and the fused CUDA kernel
  (one launch for all parameters instead of one per parameter group and op), the foreach
  kernels elsewhere. A fused optimizer takes GradScaler's found_inf into its own step, so an
  overflowing fp16 step is skipped on the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mpjob_contract.api import CompileMode


def compiles(mode: CompileMode, device: torch.device) -> bool:
    """Does training.compile `mode` compile on `device`?"""
    return mode == "always" or (mode == "auto" and device.type == "cuda")


#: The first torch whose AOTAutograd cache is known to key a training graph by the ambient
#: autocast dtype. torch 2.11's does not: a graph trained in fp16 and run again in bf16 in the
#: same process (an in-place precision change) got the fp16 kernels back, so the bf16 attempt
#: read fp16 activations and overflowed (seen on an H200 and on the CPU; 2.15 is right, the
#: releases between were not tried).
AUTOGRAD_CACHE_KEYS_AUTOCAST = (2, 15)


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string such as '2.11.0+cu130'."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def prepare_compile(mode: CompileMode, device: torch.device) -> bool:
    """Whether to compile on `device`; when so, how failures go: under `auto` a frame dynamo
    cannot compile runs eagerly (suppress_errors), under `always` the failure is raised. On a
    torch older than AUTOGRAD_CACHE_KEYS_AUTOCAST the AOTAutograd cache is off (inductor's own
    FX graph cache stays on)."""
    if not compiles(mode, device):
        return False
    import torch._dynamo
    import torch._functorch.config

    torch._dynamo.config.suppress_errors = mode == "auto"
    if torch_release(torch.__version__) < AUTOGRAD_CACHE_KEYS_AUTOCAST:
        torch._functorch.config.enable_autograd_cache = False
    return True


def compile_model(model: nn.Module, mode: CompileMode, device: torch.device) -> nn.Module:
    """`torch.compile(model)` when `mode` compiles on `device`, else the model itself."""
    return torch.compile(model) if prepare_compile(mode, device) else model  # type: ignore[return-value]


def decay_groups(named: Iterable[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict[str, Any]]:
    """Parameter groups: weight decay on parameters with >= 2 dimensions, none on the others.
    Frozen parameters are left out; a tied weight appears once; empty groups are dropped."""
    seen: set[int] = set()
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for _, param in named:
        if not param.requires_grad or id(param) in seen:
            continue
        seen.add(id(param))
        (decay if param.dim() >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


def adamw(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over `model`'s trainable parameters: decay groups, fused when they are all on CUDA."""
    groups = decay_groups(model.named_parameters(), weight_decay)
    params = [p for group in groups for p in group["params"]]
    fused = bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)
