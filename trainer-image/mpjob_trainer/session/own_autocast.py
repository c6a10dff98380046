"""A loop's own autocast around the model the session trains: told, never silently kept.

A script brought to mpjob often still holds its own `with torch.autocast(..., dtype=...)` block
(and its own GradScaler). In the attempt's precision it may go unnoticed, but it pins the
precision: after a fallback fp16 -> bf16 the forward still runs in fp16, overflows again, and
the ladder is spent down to fp32 (which still computes in fp16) with the job failed
`NoPrecisionLeft`, nothing saying why. So every module `resume()` registers gets a forward
pre-hook that compares the autocast in force with the one `run.autocast()` enters in the
current mode (session.modes: the attempt's, or fp32 while a fault is replayed): autocast off
is always fine (an fp32 forward, an evaluation without it), autocast on in another dtype, or
on where the mode has none, is a ConfigError naming what to remove. Autocast on in the mode's
own dtype is the session's only inside its own code (AttemptPrecision.ours: `run.autocast()`,
and `run.backward()`, where activation checkpointing recomputes a forward under the autocast it
saw); outside it, it is the script's own block, told at the first forward rather than at the
first fallback. The reads are constant folds under torch.compile (no graph break). A script's
block inside `run.autocast()` cannot be told apart until its dtype differs from the mode's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.modes import AttemptPrecision


def foreign_autocast(amp: AttemptPrecision) -> str | None:
    """What is wrong with the autocast in force for `amp`'s current mode, if anything."""
    kind = amp.device.type
    if not torch.is_autocast_enabled(kind):
        return None
    dtype = torch.get_autocast_dtype(kind)
    expected = amp.policy.dtype if amp.precision != "fp32" else None
    if dtype == expected and amp.own_depth:
        return None
    if dtype == expected:
        return (
            f"the model's forward ran under an autocast of {dtype} the script entered itself, not run.autocast(): "
            f"it changes nothing in this {amp.precision} attempt, but after a fallback it would pin "
            f"{amp.precision}, the precision mpjob falls back from. Remove it and your own torch.amp.GradScaler: "
            "compute the loss under `with run.autocast():`, then run.backward(loss) and run.step(optimizer) "
            "(docs/sdk.md)"
        )
    return (
        f"the model's forward ran under an autocast of {dtype} while this attempt trains in {amp.precision} "
        f"(run.autocast() enters {'no autocast' if expected is None else expected}): the script's own "
        "torch.autocast(...) block pins the precision mpjob falls back from. Remove it and your own "
        "torch.amp.GradScaler: compute the loss under `with run.autocast():`, then run.backward(loss) and "
        "run.step(optimizer), which scale in fp16 with the attempt's GradScaler (docs/sdk.md)"
    )


def check_forwards(modules: Iterable[nn.Module], amp: AttemptPrecision) -> None:
    """Hook each module so a forward under a foreign autocast raises ConfigError."""

    def check(module: nn.Module, args: Any) -> None:
        problem = foreign_autocast(amp)
        if problem is not None:
            raise ConfigError(f"{type(module).__name__}: {problem}")

    for module in modules:
        module.register_forward_pre_hook(check)
