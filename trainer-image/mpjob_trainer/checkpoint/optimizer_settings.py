"""What an optimizer's group settings read from a checkpoint say beyond their kind
(checkpoint.optimizer_state's `value_problem`), told before anything is loaded:
- settings another optimizer configuration writes (`foreign_setting`): a setting this run's
  optimizer needs that the checkpoint's group lacks (SGD's momentum, AdamW's betas: torch's load
  takes the checkpoint's group whole, and the first step fails on the missing key), or a tuple of
  as sound numbers of another length (three betas where this run's have two). The user changed the
  optimizer: a ConfigError, as every older checkpoint of the run was written so too;
- a value of the right kind no optimizer runs with (`bound_problem`): a learning rate or eps that
  is NaN, infinite or negative, betas outside [0, 1). The checkpoint's fault: CorruptCheckpoint.
The implementation flags (RUN_FLAGS) say how this process runs the step, not the training state:
the run's own are kept, whatever the checkpoint's group holds (`with_run_flags`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: Settings whose values are held to bounds: a number from 0 up (finite), each beta in [0, 1).
NON_NEGATIVE = frozenset({"lr", "eps"})
BETAS = "betas"
#: torch's implementation flags: how a process runs an optimizer's step (on which device, by which
#: kernels), never what it trains. A checkpoint written on a GPU with capturable=True, taken whole
#: by torch's load on the CPU, fails the first step (capturable wants CUDA) of every attempt.
RUN_FLAGS = ("foreach", "fused", "capturable", "differentiable")


def _number(value: Any) -> float | None:
    """`value` as a float when it is a number (an int or float, a one-value tensor), else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and not value.is_complex():
        return float(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def foreign_setting(ours: dict[str, Any], theirs: dict[str, Any]) -> str | None:
    """How the param group `theirs`, read from a checkpoint, is another optimizer configuration's
    than this run's group `ours` (None: it is not): a setting of this run's that is no flag (torch's
    load gives a missing flag its default) and that `theirs` lacks, or a tuple of numbers of
    another length (of two or more: one number in a tuple is no setting any optimizer keeps)."""
    missing = sorted(key for key in ours.keys() - theirs.keys() - {"params"} if not _flag(ours[key]))
    if missing:
        held = ", ".join(sorted(theirs.keys() - ours.keys() - {"params"})) or "none of its own"
        return f"lacks {', '.join(missing)} (it holds {held})"
    for key in sorted(ours.keys() & theirs.keys()):
        mine, read = ours[key], theirs[key]
        resized = isinstance(mine, tuple) and isinstance(read, tuple) and len(mine) != len(read) > 1
        if resized and all(_number(item) is not None for item in read):
            return f"holds {key} of {len(read)} items where this run's optimizer holds {len(mine)}"
    return None


def _flag(value: Any) -> bool:
    return value is None or isinstance(value, bool)


def bound_problem(key: str, value: Any) -> str | None:
    """Why the setting `key`'s `value` (of the kind this run holds there: `value_problem`) is no
    value an optimizer runs with (None: it is, or `key` is held to no bound)."""
    if key in NON_NEGATIVE:
        number = _number(value)
        if number is not None and not (math.isfinite(number) and number >= 0):
            return f"{number!r}, where a finite number from 0 up is allowed"
    elif key == BETAS and isinstance(value, tuple | list):
        numbers = [_number(item) for item in value]
        if any(n is not None and not 0 <= n < 1 for n in numbers):
            shown = ", ".join(repr(n) for n in numbers)
            return f"({shown}), where each beta from 0 up to below 1 is allowed"
    return None


def with_run_flags(read: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """The param group `read` from a checkpoint with the RUN_FLAGS of this run's group `live` (one
    the run's group lacks dropped: torch's load gives it its default). Loaded so, torch places the
    state (capturable's step on the parameter's device) for the step this process runs. The group's
    keys keep their order: the next checkpoint's bytes are an unbroken run's (a flag the checkpoint
    lacks goes last, where torch's load would add its default)."""
    kept = {key: live.get(key) if key in RUN_FLAGS else value for key, value in read.items()}
    kept = {key: value for key, value in kept.items() if key not in RUN_FLAGS or key in live}
    return {**kept, **{key: live[key] for key in RUN_FLAGS if key in live and key not in kept}}


def kept_run_flags(saved: Any, live: list[dict[str, Any]]) -> Any:
    """A single file's optimizer state `saved` with each param group's RUN_FLAGS those of this run's
    group at its place (`live`: torch's load pairs them by place); as read when it holds no list
    of as many groups (torch's load, or the checks before it, name that)."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(live):
        return saved
    kept = [
        with_run_flags(read, ours) if isinstance(read, dict) else read for read, ours in zip(groups, live, strict=True)
    ]
    return {**saved, "param_groups": kept}


def kept_run_flags_by_name(read: list[dict[str, Any]], live: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """DCP's param groups `read` (their params named) with the RUN_FLAGS of this run's group of the
    same parameters among `live` (set_state_dict pairs them by name: checkpoint.dcp_fit checked
    that they group them alike)."""
    ours = {tuple(sorted(group["params"])): group for group in live}
    return [
        with_run_flags(group, ours[key]) if (key := tuple(sorted(group["params"]))) in ours else group for group in read
    ]
