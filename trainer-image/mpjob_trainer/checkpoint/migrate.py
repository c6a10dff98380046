"""Bringing a checkpoint of an older format forward to the current one (checkpoint.manifest
lists the versions).

Version 1 -> 2: the builtin loop's AdamW had one parameter group over `model.parameters()`;
it now has two (decay / no decay, speed.decay_groups), and torch refuses to load an optimizer
state whose groups differ. The per-parameter state (step, exp_avg, exp_avg_sq) does not depend
on the grouping, so it is moved by parameter identity: entry k of the old single group is the
k-th parameter of the module the optimizer trains, and it goes to the id that parameter has
in today's groups. Each group keeps its hyperparameters from the checkpoint (the learning rate
the schedule reached, betas, eps) but its weight decay from today's grouping (that is what the
split is for) and today's implementation flags (fused, foreach). An optimizer whose groups
already match (a version-1 checkpoint written after the split, or a user's own optimizer)
loads exactly as before; one that cannot be mapped is a configuration error that names the
format and what to do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpjob_trainer.checkpoint.manifest import FORMAT_VERSION
from mpjob_trainer.errors import ConfigError

#: Group settings taken from today's optimizer, not the checkpoint: the decay split itself, and
#: how this run steps (a fused AdamW on CUDA), which is no training state.
_TODAYS = ("params", "weight_decay", "fused", "foreach", "capturable", "differentiable")
#: Set by CheckpointStore.verify in a state loaded from an older format (never written).
FORMAT_KEY = "formatVersion"


def upgrade(state: dict[str, Any], objects: dict[str, Any]) -> dict[str, Any]:
    """`state` as the current format holds it, for restoring into the run's `objects`."""
    version = int(state.get(FORMAT_KEY, FORMAT_VERSION))
    if version >= FORMAT_VERSION:
        return state
    upgraded = {key: value for key, value in state.items() if key != FORMAT_KEY}
    modules = [obj for obj in objects.values() if isinstance(obj, nn.Module)]
    for name, optimizer in objects.items():
        saved = upgraded.get(name)
        if not isinstance(optimizer, torch.optim.Optimizer) or not isinstance(saved, dict):
            continue
        problem = f"the checkpoint of step {state.get('step')} is in checkpoint format {version}"
        try:
            if len(saved.get("param_groups", [])) == len(optimizer.param_groups):
                continue  # the grouping is unchanged: torch loads it as it is
            upgraded[name] = split_groups(saved, optimizer, _trained_module(optimizer, modules, saved), name, problem)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as exc:  # read from a store: any shape
            raise ConfigError(
                f"{problem}: its {name!r} is no optimizer state of that format ({exc!r:.200}): resume with the "
                "optimizer built as the run that wrote it built it, or start afresh in a new checkpoint folder"
            ) from None
    return upgraded


def _trained_module(
    optimizer: torch.optim.Optimizer, modules: list[nn.Module], saved: dict[str, Any]
) -> nn.Module | None:
    """The one registered module whose parameters the format-1 single group listed."""
    live = {id(p) for group in optimizer.param_groups for p in group["params"]}
    groups = saved.get("param_groups", [])
    count = len(groups[0].get("params", [])) if len(groups) == 1 else -1
    fits = [
        module
        for module in modules
        if live <= {id(p) for p in module.parameters()} and len(list(module.parameters())) == count
    ]
    return fits[0] if len(fits) == 1 else None


def split_groups(
    saved: dict[str, Any], optimizer: torch.optim.Optimizer, module: nn.Module | None, name: str, problem: str
) -> dict[str, Any]:
    """The single-group optimizer state `saved` re-split into `optimizer`'s groups, by parameter."""
    if module is None:
        raise ConfigError(
            f"{problem}: its {name!r} has {len(saved.get('param_groups', []))} parameter group(s) and this run's "
            f"has {len(optimizer.param_groups)}, and no registered module's parameters match its single group "
            f"(the format-{FORMAT_VERSION - 1} builtin layout). Resume with the optimizer built as the run that "
            "wrote it built it, or start afresh in a new checkpoint folder"
        )
    (old_group,) = saved["param_groups"]
    order = list(module.parameters())
    saved_id = {id(param): old_id for param, old_id in zip(order, old_group["params"], strict=True)}
    state: dict[Any, Any] = {}
    groups: list[dict[str, Any]] = []
    next_id = 0
    for group in optimizer.param_groups:
        ids = []
        for param in group["params"]:
            per_param = saved["state"].get(saved_id[id(param)])
            if per_param is not None:
                _check_shapes(per_param, param, name, problem)
                state[next_id] = per_param
            ids.append(next_id)
            next_id += 1
        hyper = {key: value for key, value in old_group.items() if key not in _TODAYS}
        todays = {key: group[key] for key in _TODAYS if key in group and key != "params"}
        groups.append({**hyper, **todays, "params": ids})
    return {"state": state, "param_groups": groups}


def _check_shapes(per_param: dict[str, Any], param: torch.Tensor, name: str, problem: str) -> None:
    for key, value in per_param.items():
        if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != param.shape:
            raise ConfigError(
                f"{problem}: its {name!r} state {key!r} has shape {tuple(value.shape)} where this run's parameter "
                f"has {tuple(param.shape)}; the model changed since it was written: start afresh in a new "
                "checkpoint folder"
            )
