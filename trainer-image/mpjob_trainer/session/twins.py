"""Twins on the meta device: a module's or an optimizer's structure without its memory, for a
checkpoint's state to be loaded into first (session.fits.check_loads).

torch loads a state in place, one object after another, and checks it while it loads: keys and
shapes (a module, its own `_load_from_state_dict` included), group counts and sizes (an
optimizer). Loading into a twin runs those very checks and changes nothing of the run's objects;
no tensor is copied (a meta tensor holds no data). A twin is None where one cannot be made (a
module that does not deep-copy, an optimizer whose constructor wants more than its defaults, a
sharded parameter): the object's own load checks it, as before."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch
from torch import nn

from mpjob_trainer.checkpoint.optimizer_settings import RUN_FLAGS
from mpjob_trainer.distributed import is_dtensor


def _meta(tensor: torch.Tensor) -> torch.Tensor:
    twin = torch.empty_like(tensor, device="meta")
    return nn.Parameter(twin, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else twin


def module_twin(module: nn.Module) -> nn.Module | None:
    """`module` with every parameter, buffer and tensor attribute on the meta device."""
    tensors = [t for m in module.modules() for t in (*vars(m).values(), *m.parameters(False), *m.buffers(False))]
    held = [t for t in tensors if isinstance(t, torch.Tensor)]
    if any(is_dtensor(t) for t in held):
        return None
    memo: dict[Any, Any] = {id(t): _meta(t) for t in held}
    try:
        return copy.deepcopy(module, memo)
    except Exception:  # what does not copy (a handle, a lock) is checked by its own load
        return None


def optimizer_twin(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer | None:
    """An optimizer of `optimizer`'s kind and settings over meta twins of its parameters (its
    implementation flags left at their defaults: a fused kernel wants a real device)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(is_dtensor(p) for p in params):
        return None
    twins = {id(p): _meta(p) for p in params}
    groups = [
        {**{k: v for k, v in group.items() if k not in RUN_FLAGS}, "params": [twins[id(p)] for p in group["params"]]}
        for group in optimizer.param_groups
    ]
    accepted = inspect.signature(type(optimizer)).parameters
    anything = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    settings = {k: v for k, v in optimizer.defaults.items() if k not in RUN_FLAGS and (anything or k in accepted)}
    try:
        return type(optimizer)(groups, **settings)
    except Exception:  # a constructor that wants more: its own load checks it
        return None
