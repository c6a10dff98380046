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
loads exactly as before; one that cannot be mapped to this run's optimizer (the user changed the
model or the optimizer) is a configuration error that names the format and what to do. What is
read is checked before it is mapped, by the rule every format's is (checkpoint.optimizer_state):
an optimizer state no optimizer writes, or one that disagrees with the checkpoint's own weights,
is the checkpoint's fault, CorruptCheckpoint, so the resume passes it over for the one before it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpjob_trainer.checkpoint.manifest import FORMAT_VERSION, CorruptCheckpoint
from mpjob_trainer.checkpoint.optimizer_state import (
    check_current,
    check_shapes,
    is_optimizer_state,
    optimizer_state_problem,
    own_shapes,
    own_weights,
    shaped_states,
)
from mpjob_trainer.errors import ConfigError

#: Group settings taken from today's optimizer, not the checkpoint: the decay split itself, and
#: how this run steps (a fused AdamW on CUDA), which is no training state.
_TODAYS = ("params", "weight_decay", "fused", "foreach", "capturable", "differentiable")
#: Set by CheckpointStore.verify in a state loaded from an older format (never written).
FORMAT_KEY = "formatVersion"


def upgrade(state: dict[str, Any], objects: dict[str, Any]) -> dict[str, Any]:
    """`state` as the current format holds it, for restoring into the run's `objects`, its
    optimizer states checked by the one rule of checkpoint.optimizer_state: CorruptCheckpoint when
    one disagrees with itself, a ConfigError when it does not fit (or map to) this run's optimizer."""
    version = int(state.get(FORMAT_KEY, FORMAT_VERSION))
    problem = f"the checkpoint of step {state.get('step')}"
    if version >= FORMAT_VERSION:
        check_current(state, objects, problem)
        return state
    problem = f"{problem} is in checkpoint format {version}"
    upgraded = {key: value for key, value in state.items() if key != FORMAT_KEY}
    modules = {key: obj for key, obj in objects.items() if isinstance(obj, nn.Module)}
    for name, optimizer in objects.items():
        saved = upgraded.get(name)
        if not isinstance(optimizer, torch.optim.Optimizer) or not is_optimizer_state(saved):
            continue  # another object's state, no optimizer's: torch's load names what does not fit
        if (malformed := optimizer_state_problem(saved)) is not None:
            raise CorruptCheckpoint(f"{problem}: its {name!r} is no optimizer state: {malformed}")
        if len(saved["param_groups"]) == len(optimizer.param_groups):
            continue  # the grouping is unchanged: torch loads it as it is
        trained = _trained_module(optimizer, modules, saved)
        written = upgraded.get(trained) if trained is not None else None
        module = modules[trained] if trained is not None else None
        upgraded[name] = split_groups(saved, optimizer, module, name, problem, written=written)
    check_current(upgraded, objects, problem)  # what it left as it was: torch loads it so
    return upgraded


def _trained_module(
    optimizer: torch.optim.Optimizer, modules: dict[str, nn.Module], saved: dict[str, Any]
) -> str | None:
    """The name of the one registered module whose parameters the format-1 single group listed."""
    live = {id(p) for group in optimizer.param_groups for p in group["params"]}
    groups = saved.get("param_groups", [])
    count = len(groups[0].get("params", [])) if len(groups) == 1 else -1
    fits = [
        key
        for key, module in modules.items()
        if live <= {id(p) for p in module.parameters()} and len(list(module.parameters())) == count
    ]
    return fits[0] if len(fits) == 1 else None


def split_groups(
    saved: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    module: nn.Module | None,
    name: str,
    problem: str,
    *,
    written: Any = None,
) -> dict[str, Any]:
    """The single-group optimizer state `saved` (well-formed: `optimizer_state_problem`) re-split
    into `optimizer`'s groups, by parameter; `written`: the checkpoint's own state of `module`."""
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
    own = own_shapes(own_weights({"module": written}, {"module": module}).values())
    state: dict[Any, Any] = {}
    groups: list[dict[str, Any]] = []
    next_id = 0
    for group in optimizer.param_groups:
        ids = []
        for param in group["params"]:
            per_param = saved["state"].get(saved_id[id(param)])
            if per_param is not None:
                check_shapes(shaped_states(optimizer, per_param), param, own, name, problem)
                state[next_id] = per_param
            ids.append(next_id)
            next_id += 1
        hyper = {key: value for key, value in old_group.items() if key not in _TODAYS}
        todays = {key: group[key] for key in _TODAYS if key in group and key != "params"}
        groups.append({**hyper, **todays, "params": ids})
    return {"state": state, "param_groups": groups}
