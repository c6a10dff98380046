"""What a sharded checkpoint's index says, checked against itself and this run before DCP loads
anything (`check_fit`), by checkpoint.optimizer_state's rules, the ones a single-file checkpoint
is held to: what disagrees with the index itself is the checkpoint's fault (CorruptCheckpoint:
the resume passes it over for the one before it); what does not fit this run's objects is a
ConfigError that names what to do."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint import metadata as dcp_metadata

from mpjob_trainer.checkpoint.dcp_reader import listed_values, plain_value
from mpjob_trainer.checkpoint.dtypes import check_dtype
from mpjob_trainer.checkpoint.extra_state import check_extra_states
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.optimizer_state import (
    PARAMETER_SHAPED,
    SHAPE_KEEPING,
    check_configuration,
    grouping_problem,
    own_shape_problem,
    regrouping,
    setting_problem,
)
from mpjob_trainer.checkpoint.peers import Peers, agreed
from mpjob_trainer.errors import ConfigError

if TYPE_CHECKING:
    from mpjob_trainer.checkpoint.shard_copies import CheckedShards


def checked_before_load(
    shards: CheckedShards, target: dict[str, Any], names: dict[str, str], module: Any, optimizer: Any
) -> None:
    """Every check made before DCP loads anything into `target`, each rank's verdict agreed
    (peers.agreed), since DCP's load is collective: a rank whose check failed alone (a read of
    the index that failed there) would leave the others waiting in it. The run's setup
    (`check_loadable`) and the script's own code (the module's extra states) fail as a ConfigError,
    the checkpoint's fault (`check_fit`) as CorruptCheckpoint; another failure is raised on its
    rank and PeerFailed on the others."""

    def checks() -> None:
        check_loadable(target, names)
        check_extra_states(module, names["module"])
        check_fit(shards, target, names, optimizer)

    agreed(checks, Peers.current())


def check_fit(shards: CheckedShards, target: dict[str, Any], names: dict[str, str], optimizer: Any = None) -> None:
    """Before DCP loads anything into `target` (the live state dicts of the pair `names`), what the
    checkpoint's index says is checked by checkpoint.optimizer_state's rules: the optimizer's states
    agree with the module's own entries, its groups with the parameters it lists and with this
    run's `optimizer` (the live one: its configuration, `check_configuration`, a ConfigError in the
    single-file checkpoint's words), and every non-tensor value of `target`'s it lists (an
    optimizer's settings: lr, betas, ...) reads as a value of the kind this run holds there.
    Each tensor it lists is of the dtype of this run's (checkpoint.dtypes: a ConfigError).
    CorruptCheckpoint, saying why, when not: the checkpoint's fault, passed over for the one before
    it, where a value read raw would fail the first step of every attempt. The shapes are held
    only for the states `optimizer` keeps in its parameter's shape (PARAMETER_SHAPED, of
    SHAPE_KEEPING's kinds): another library's may keep a state of that name in another shape."""
    where, metadata = shards.folder.name, shards.index()
    values = {
        index.fqn: plain_value(f"{where}: {index.fqn}", shards.read(info.relative_path, info.offset, info.length))
        for index, info in listed_values(metadata)
    }
    if "optimizer" in names:
        if isinstance(optimizer, SHAPE_KEEPING):
            _check_own_entries(metadata, names["module"], names["optimizer"], where)
        groups = _groups(values, names["optimizer"])
        _check_groups(metadata, groups, target, names, where)
        check_configuration(optimizer, [groups[index] for index in sorted(groups)], names["optimizer"], where)
    planner = DefaultLoadPlanner()  # its flattened state dict: the keys DCP reads into
    planner.set_up_planner(target, metadata)
    live = planner.state_dict
    for fqn, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, dcp_metadata.TensorStorageMetadata) and isinstance(live.get(fqn), torch.Tensor):
            check_dtype(where, fqn, entry.properties.dtype, live[fqn].dtype)  # checkpoint.dtypes' rule
    for fqn, value in values.items():
        if fqn in live and (problem := _value_problem(fqn, live[fqn], value)) is not None:
            raise CorruptCheckpoint(f"{where}: its {fqn} is {problem}")


def _value_problem(fqn: str, live: Any, read: Any) -> str | None:
    """Why the index's plain value `read` cannot take the place of this run's `live` one under
    `fqn`: `setting_problem`'s rule, and a tensor, which DCP writes as a tensor entry, never as a
    plain value (one read so would be loaded unchecked: a weight of another shape, another rank's
    whole state where this rank holds its shard)."""
    if isinstance(live, torch.Tensor) and isinstance(read, torch.Tensor):
        return f"a tensor {tuple(read.shape)} written as a plain value, as DCP never writes one"
    return setting_problem(fqn.rpartition(".")[2], live, read)


def check_loadable(target: dict[str, Any], names: dict[str, str]) -> None:
    """A ConfigError when torch's set_state_dict cannot load this run's optimizer, whatever the
    checkpoint (more than one of its param groups without parameters: torch takes the checkpoint's
    group by the parameters it names), told before anything loads."""
    if "optimizer" not in names:
        return
    empty = [index for index, group in enumerate(target[names["optimizer"]]["param_groups"]) if not group["params"]]
    if len(empty) > 1:
        raise ConfigError(
            f"this run's {names['optimizer']} has {len(empty)} parameter groups without parameters (groups "
            f"{', '.join(map(str, empty[:5]))}); a sharded checkpoint loads into an optimizer with at most one: "
            "drop the empty groups"
        )


def _groups(values: dict[str, Any], optimizer: str) -> dict[int, dict[str, Any]]:
    """The param groups of `optimizer` among the index's non-tensor `values` (by full name), by
    number: each its settings and `params`, as DCP lists them (`<optimizer>.param_groups.<n>.<key>`)."""
    listed = re.compile(rf"{re.escape(optimizer)}\.param_groups\.([0-9]{{1,9}})\.([^.]+)")
    groups: dict[int, dict[str, Any]] = {}
    for fqn, value in values.items():
        if found := listed.fullmatch(fqn):
            groups.setdefault(int(found[1]), {})[found[2]] = value
    return groups


def _check_own_entries(metadata: dcp_metadata.Metadata, module: str, optimizer: str, where: str) -> None:
    """The index's optimizer state of each parameter has the shape of the index's own entry of its
    weight (`optimizer.state.<param>.<key>` beside `module.<param>`), else CorruptCheckpoint."""
    entries, prefix = metadata.state_dict_metadata, f"{optimizer}.state."
    for fqn, entry in entries.items():
        if not fqn.startswith(prefix) or not isinstance(entry, dcp_metadata.TensorStorageMetadata):
            continue
        param, _, key = fqn.removeprefix(prefix).rpartition(".")
        if key not in PARAMETER_SHAPED:
            continue  # a state not kept in the parameter's shape (LBFGS's flat vectors)
        own = entries.get(f"{module}.{param}")
        own_shape = tuple(own.size) if isinstance(own, dcp_metadata.TensorStorageMetadata) else None
        if (problem := own_shape_problem(key, tuple(entry.size), own_shape)) is not None:
            raise CorruptCheckpoint(f"{where}: its index's {optimizer!r} {problem} ({param[:100]})")


def _check_groups(
    metadata: dcp_metadata.Metadata,
    groups: dict[int, dict[str, Any]],
    target: dict[str, Any],
    names: dict[str, str],
    where: str,
) -> None:
    """The index's optimizer `groups` name its own parameters (`grouping_problem`, else
    CorruptCheckpoint) and group them as this run's optimizer in `target` does (`regrouping`, else a
    ConfigError): DCP would read this run's count of groups, and torch take each one's settings for
    the parameters it names, a parameter it does not name left without lr or betas."""
    module, optimizer, entries = names["module"], names["optimizer"], metadata.state_dict_metadata
    read = {index: group["params"] for index, group in groups.items() if "params" in group}
    own = {fqn.removeprefix(f"{module}.") for fqn in entries if fqn.startswith(f"{module}.")}
    held = (fqn.removeprefix(f"{optimizer}.state.") for fqn in entries if fqn.startswith(f"{optimizer}.state."))
    if (problem := grouping_problem(read, own, {fqn.rpartition(".")[0] for fqn in held})) is not None:
        raise CorruptCheckpoint(f"{where}: its index's {optimizer!r} {problem}: the checkpoint disagrees with itself")
    live = [group["params"] for group in target[optimizer]["param_groups"]]
    if (regrouped := regrouping([read[index] for index in sorted(read)], live)) is not None:
        raise ConfigError(
            f"cannot load the sharded checkpoint {where} into this run's {optimizer}: it {regrouped}: the script no "
            "longer matches the run that wrote it (its optimizer was regrouped); build the optimizer as that run "
            "did, or start afresh in a new checkpoint folder"
        )
