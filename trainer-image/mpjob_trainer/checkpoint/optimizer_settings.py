"""What an optimizer's group settings read from a checkpoint say beyond their kind
(checkpoint.optimizer_state's `value_problem`), told before anything is loaded:
- settings another optimizer configuration writes (`foreign_setting`): a setting this run's
  optimizer needs that the checkpoint's group lacks (SGD's momentum, AdamW's betas: torch's load
  takes the checkpoint's group whole, and the first step fails on the missing key), or a tuple of
  as sound numbers of another length (three betas where this run's have two). The user changed the
  optimizer: a ConfigError, as every older checkpoint of the run was written so too;
- a value of the right kind no optimizer runs with (`bound_problem`): a learning rate or eps that
  is NaN, infinite or negative, betas outside [0, 1). The checkpoint's fault: CorruptCheckpoint.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: Settings whose values are held to bounds: a number from 0 up (finite), each beta in [0, 1).
NON_NEGATIVE = frozenset({"lr", "eps"})
BETAS = "betas"


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
