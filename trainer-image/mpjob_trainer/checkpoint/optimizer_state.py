"""Whose fault an optimizer state read from a checkpoint is, told before anything is loaded.

A checkpoint is read from a store, so under an optimizer's name it may hold any plain value.
One rule, for every format (checkpoint.migrate brings a format-1 state forward with it, the
restore checks a current one with it, session.state):
- a state no optimizer writes (`optimizer_state_problem`: groups or per-parameter states of
  another kind of value, an id listed twice), one whose group settings are of another kind than
  this run's optimizer holds there (`settings_problem`, by `value_problem`, the rule a sharded
  checkpoint's values are held to), or a per-parameter tensor one of torch's optimizers keeps in
  its parameter's shape (`shaped_states`) whose shape is that of none of the checkpoint's own
  weights of the optimizer's parameters, is the checkpoint's fault: it disagrees with itself or
  with what any optimizer of this kind holds. CorruptCheckpoint: the resume passes it over for
  the one before it;
- a sound state that does not fit this run's parameters (the user changed the model, the order
  its parameters are listed in, or the optimizer: `other_configuration`, by
  checkpoint.optimizer_settings, whose value bounds `settings_problem` holds settings to too) is a
  ConfigError that names what to do, as torch's own load errors that remain.
A parameter's checkpoint weight is the one its module (registered beside the optimizer) wrote
under the parameter's name. The optimizer's states follow the order its run listed the
parameters in, which the checkpoint does not record: a state is compared with the set of its
own weights' shapes, not with the weight of the parameter this run lists at its place, so a
model whose layers are registered in another order is the model changed, not every checkpoint
of the job corrupt.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, TypeGuard

import torch
from torch import nn

from mpjob_trainer.checkpoint.dtypes import check_dtype
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.optimizer_settings import bound_problem, foreign_setting
from mpjob_trainer.errors import ConfigError


def optimizer_state_problem(saved: dict[str, Any]) -> str | None:
    """What makes `saved`, read as a torch optimizer's state_dict, one no optimizer writes (None:
    nothing): `state` a dict, `param_groups` a non-empty list of dicts whose `params` are lists of
    distinct integer ids, and the state of each listed id, where there is one, a dict."""
    per_param, groups = saved.get("state"), saved.get("param_groups")
    if not isinstance(per_param, dict):
        return f"its state is a {type(per_param).__name__}, not a dict"
    if not isinstance(groups, list) or not groups:
        return f"its param_groups are no non-empty list of groups (a {type(groups).__name__})"
    ids: list[Any] = []
    for index, group in enumerate(groups):
        params = group.get("params") if isinstance(group, dict) else None
        if not isinstance(params, list) or not all(type(i) is int for i in params):
            return f"its param group {index} is no dict with a list of integer parameter ids under params"
        ids.extend(params)
    if len(set(ids)) != len(ids):
        return "a parameter id is listed twice in its param groups"
    if odd := [i for i in ids if i in per_param and not isinstance(per_param[i], dict)]:
        return f"its state for parameter id {odd[0]} is a {type(per_param[odd[0]]).__name__}, not a dict"
    return None


def is_optimizer_state(saved: Any) -> TypeGuard[dict[str, Any]]:
    """Does `saved` claim to be an optimizer's state_dict (a dict with either of its keys)? Another
    object's state under an optimizer's name is left to torch's load, which names what does not fit."""
    return isinstance(saved, dict) and bool({"state", "param_groups"} & set(saved))


def own_weights(state: dict[str, Any], objects: dict[str, Any]) -> dict[int, Any]:
    """The checkpoint's own weight of each parameter of the modules among `objects` (by id of
    the parameter; what their states in `state` hold under its name, None where nothing)."""
    weights: dict[int, Any] = {}
    for name, module in objects.items():
        if isinstance(module, nn.Module):
            written = state.get(name)
            held = written if isinstance(written, dict) else {}
            weights.update({id(param): held.get(key) for key, param in module.named_parameters()})
    return weights


def check_current(state: dict[str, Any], objects: dict[str, Any], problem: str) -> None:
    """Check each optimizer state a current-format `state` holds for the optimizers among
    `objects` (the rule above): CorruptCheckpoint or ConfigError, saying why. `problem`: which
    checkpoint it is, as messages start."""
    for name, optimizer in objects.items():
        saved = state.get(name)
        if not isinstance(optimizer, torch.optim.Optimizer) or not is_optimizer_state(saved):
            continue
        if (malformed := optimizer_state_problem(saved)) is not None:
            raise CorruptCheckpoint(f"{problem}: its {name!r} is no optimizer state: {malformed}")
        check_configuration(optimizer, saved["param_groups"], name, problem)
        if (wrong := settings_problem(optimizer.param_groups, saved["param_groups"])) is not None:
            raise CorruptCheckpoint(f"{problem}: its {name!r} {wrong}")
        live = [param for group in optimizer.param_groups for param in group["params"]]
        ids = [i for group in saved["param_groups"] for i in group["params"]]
        if len(ids) != len(live):
            continue  # another count of parameters: torch's load names the groups that differ
        weights = own_weights(state, objects)
        own = own_shapes(weights.get(id(param)) for param in live)
        for param, saved_id in zip(live, ids, strict=True):
            if (per_param := saved["state"].get(saved_id)) is not None:
                check_shapes(shaped_states(optimizer, per_param), param, own, name, problem)


def check_configuration(optimizer: torch.optim.Optimizer, read: list[Any], name: str, problem: str) -> None:
    """A ConfigError when the param groups `read` from a checkpoint (a single file's or DCP's
    index's, as `name`'s) are another optimizer configuration's than this run's `optimizer`
    (`other_configuration`). `problem`: which checkpoint it is, as messages start."""
    if (other := other_configuration(optimizer.param_groups, read)) is not None:
        raise ConfigError(
            f"{problem}: its {name!r} {other}: it was written by another optimizer configuration than this "
            f"run's {type(optimizer).__name__} (the optimizer or its settings changed); build the optimizer as "
            "that run did, or start afresh in a new checkpoint folder"
        )


def other_configuration(live: list[dict[str, Any]], read: list[Any]) -> str | None:
    """Which param group `read` from a checkpoint is another optimizer configuration's than this
    run's (`live`, group by group; `foreign_setting`), None: none is, or the groups are as many no
    more (torch's load names that)."""
    if len(read) != len(live):
        return None
    found = ((i, foreign_setting(ours, theirs)) for i, (ours, theirs) in enumerate(zip(live, read, strict=True)))
    return next((f"param group {index} {other}" for index, other in found if other is not None), None)


def settings_problem(live: list[dict[str, Any]], read: list[Any]) -> str | None:
    """Which setting of the param groups `read` from a checkpoint cannot take the place of this
    run's (`live`, group by group) by `value_problem`, the rule a sharded checkpoint's values are
    held to (None: each fits, or the groups are as many no more: torch's load names that). Their
    `params` are ids here, checked by `optimizer_state_problem`."""
    if len(read) != len(live):
        return None
    for index, (ours, theirs) in enumerate(zip(live, read, strict=True)):
        for key in sorted((ours.keys() & theirs.keys()) - {"params"}):
            if (wrong := setting_problem(key, ours[key], theirs[key])) is not None:
                return f"param group {index}'s {key} is {wrong}"
    return None


def grouping_problem(read: dict[int, Any], own: Collection[str], stated: Collection[str]) -> str | None:
    """Why the parameter names a sharded checkpoint's index lists in its optimizer's groups (`read`:
    group number -> its params value) disagree with that index (None: they do not): groups numbered
    0 to n-1, each a list of names of its own weights (`own`), none twice, and each parameter it
    holds optimizer state of (`stated`) in a group."""
    if sorted(read) != list(range(len(read))):
        return f"numbers its parameter groups {sorted(read)[:5]}, not 0 to {len(read) - 1}"
    seen: set[str] = set()
    for index in range(len(read)):
        names = read[index]
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            return f"lists no names in parameter group {index} (a {type(names).__name__})"
        for name in names:
            if name not in own or name in seen:
                why = "twice" if name in seen else "in a parameter group, no weight of its own"
                return f"lists {name[:100]!r} {why}"
            seen.add(name)
    if unlisted := sorted(set(stated) - seen):
        return f"holds optimizer state of {unlisted[0][:100]!r}, listed in no parameter group"
    return None


def regrouping(read: list[list[str]], live: list[list[str]]) -> str | None:
    """How the parameter groups `read` from a checkpoint (well formed: `grouping_problem`) differ
    from this run's `live` ones, each a list of parameter names (None: the same groups, in any order:
    they are matched by name; or other parameters in all: the model changed, which DCP's planning
    names by the key that differs)."""
    same = sorted(map(sorted, read)) == sorted(map(sorted, live))
    if same or sorted(name for names in read for name in names) != sorted(name for names in live for name in names):
        return None

    def shown(groups: list[list[str]]) -> str:
        return " | ".join(", ".join(names) or "(none)" for names in groups)[:300]

    return f"groups its parameters as {shown(read)} and this run's optimizer as {shown(live)}"


#: The per-parameter states torch's optimizers keep in their parameter's shape (Adam, AdamW,
#: NAdam, RAdam, Adamax, SGD, RMSprop, Adagrad, Adadelta, Rprop, ASGD). Others are not held to
#: it: LBFGS keeps flat direction vectors, a factored optimizer keeps row and column statistics.
PARAMETER_SHAPED = frozenset(
    {"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "exp_inf", "momentum_buffer", "square_avg", "grad_avg"}
    | {"acc_delta", "sum", "prev", "step_size", "ax"}
)
#: The optimizers that keep those states so: torch's (and subclasses of them). An optimizer of
#: another kind may keep a state of the same name in another shape (GaLore's Adam keeps its
#: moments in the low-rank shape of the projected gradient): it is not held to them.
SHAPE_KEEPING: tuple[type[torch.optim.Optimizer], ...] = (
    *(torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax),
    *(torch.optim.SGD, torch.optim.RMSprop, torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.Rprop),
    *(torch.optim.ASGD, torch.optim.SparseAdam),
)


def shaped_states(optimizer: torch.optim.Optimizer, per_param: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The tensors of one parameter's state `per_param` that `optimizer` keeps in its parameter's
    shape (PARAMETER_SHAPED, when it is one of SHAPE_KEEPING's kinds; none when it is not)."""
    if not isinstance(optimizer, SHAPE_KEEPING):
        return {}
    return {
        key: value
        for key, value in per_param.items()
        if key in PARAMETER_SHAPED and isinstance(value, torch.Tensor) and value.dim() > 0
    }


def own_shapes(weights: Iterable[Any]) -> frozenset[torch.Size]:
    """The shapes of the checkpoint's own `weights` (what is no tensor left out)."""
    return frozenset(weight.shape for weight in weights if isinstance(weight, torch.Tensor))


def check_shapes(
    shaped: dict[str, torch.Tensor], param: torch.Tensor, own: frozenset[torch.Size], name: str, problem: str
) -> None:
    """A state kept in its parameter's shape (`shaped_states`) of a shape none of the checkpoint's
    own weights has (`own`, their shapes; none known: not compared) is the checkpoint's fault
    (CorruptCheckpoint: it disagrees with itself); one of another shape than this run's `param`
    is the model changed (ConfigError), as one of another dtype (checkpoint.dtypes)."""
    for key, value in shaped.items():
        if own and value.shape not in own:
            mine = ", ".join(str(tuple(shape)) for shape in sorted(own))
            raise CorruptCheckpoint(
                f"{problem}: its {name!r} state {key!r} has shape {tuple(value.shape)} where the checkpoint's own "
                f"weights of the optimizer's parameters have {mine}: the checkpoint disagrees with itself"
            )
        if value.shape != param.shape:
            raise ConfigError(
                f"{problem}: its {name!r} state {key!r} has shape {tuple(value.shape)} where this run's parameter "
                f"has {tuple(param.shape)}; the model changed since it was written (its parameters, or the order "
                "they are registered in): start afresh in a new checkpoint folder"
            )
        check_dtype(problem, f"{name!r} state {key!r}", value.dtype, param.dtype)  # checkpoint.dtypes' rule


def own_shape_problem(key: str, shape: tuple[int, ...], own: tuple[int, ...] | None) -> str | None:
    """Why a parameter's state `key` of `shape` disagrees with the checkpoint's own weight of that
    parameter, of shape `own` (None: no weight to compare with): a state of more than one value has
    the weight's shape. For DCP's index, whose states name their parameter (a single file's are
    matched by position, so `check_shapes` holds them to the set of its own weights' shapes)."""
    if not shape or own is None or shape == own:
        return None
    return (
        f"state {key!r} has shape {shape} where the checkpoint's own weight of that parameter has {own}: "
        "the checkpoint disagrees with itself"
    )


def setting_problem(key: str, live: Any, read: Any) -> str | None:
    """Why the setting `key`'s value `read` from a checkpoint cannot take the place of the run's
    `live` one: of another kind (`value_problem`), or of a value no optimizer runs with (`bound_problem`)."""
    return value_problem(live, read) or bound_problem(key, read)


def value_problem(live: Any, read: Any) -> str | None:
    """Why the value `read` from a checkpoint cannot take the place of the run's `live` one (None:
    it can), by kind, as an optimizer's settings and counts are read (any plain value can be
    written there): a number (int, float or a one-value tensor) for a number, None or a bool for a
    flag (None or a bool), a tensor for a tensor, a str for a str, a tuple of as many for a tuple
    (betas), a list of the kind of its items for a list, a dict for a dict (its common keys alike);
    another object only as one of its type."""
    if isinstance(live, torch.Tensor) and live.dim() > 0:
        fits = isinstance(read, torch.Tensor)
    elif live is None or isinstance(live, bool):
        fits = read is None or isinstance(read, bool | int | float)
    elif isinstance(live, int | float | torch.Tensor):
        fits = (isinstance(read, int | float) and not isinstance(read, bool)) or (
            isinstance(read, torch.Tensor) and read.dim() == 0
        )
    elif isinstance(live, tuple | list | dict):
        return _container_problem(live, read)
    else:
        fits = type(read) is type(live)
    return None if fits else f"a {type(read).__name__} where this run holds a {type(live).__name__}"


def _container_problem(live: tuple[Any, ...] | list[Any] | dict[Any, Any], read: Any) -> str | None:
    """`value_problem` of a tuple, list or dict `live`: the same kind, each item by its counterpart."""
    if not isinstance(read, type(live)) or (isinstance(live, tuple) and len(read) != len(live)):
        held = f"{len(read)} items" if isinstance(read, tuple | list | dict) else type(read).__name__
        return f"a {type(read).__name__} ({held}) where this run holds a {type(live).__name__} of {len(live)}"
    if isinstance(live, dict):
        pairs = [(live[key], read[key]) for key in live if key in read]
    elif isinstance(live, tuple):
        pairs = list(zip(live, read, strict=True))
    else:  # a list (a group's params): any length, every item of the kind of this run's first
        pairs = [(live[0], item) for item in read] if live else []
    return next((problem for a, b in pairs if (problem := value_problem(a, b)) is not None), None)
