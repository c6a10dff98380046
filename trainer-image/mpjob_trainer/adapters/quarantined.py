"""TakenBack: how a framework's step at a quarantined index trains on nothing, for every adapter.

When the data rung skips a step under a framework (session.framework: the step is quarantined
whole, and the framework re-entered from a checkpoint), the framework draws that step's batch
as ever, so its data position stays a function of the global step. Neither framework can be
told to leave the update out: transformers always clips and steps (and fp16's GradScaler
refuses a step without gradients), and Lightning refuses a `training_step` that returns None
under DDP. So the step's `training_step` runs no forward and makes zero gradients (every rank
alike: the quarantine is the same on all), the framework steps as it always does, and the
update that AdamW-like optimizers still make from zero gradients (moments, weight decay) is
taken back at the step's end: weights, optimizer state and the loss scale as before the step.
The global step and the LR schedule go on, as for any step.

Cost: a copy of the weights and the optimizer state, at quarantined steps only.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from mpjob_trainer.session.framework import FrameworkRun


@dataclass(frozen=True)
class _Held:
    params: list[torch.Tensor]
    weights: list[torch.Tensor]
    optimizers: list[dict[str, Any]]
    scale: dict[str, Any] | None


class TakenBack:
    """The update of the quarantined step the framework is in, held and then taken back."""

    def __init__(self, bridge: FrameworkRun, optimizers: Callable[[], list[torch.optim.Optimizer]]) -> None:
        self.bridge = bridge
        self.optimizers = optimizers  # the framework's own (unwrapped), asked at each use
        self._held: _Held | None = None

    def skips(self, step: int) -> bool:
        """Is optimizer step `step` (0-based) quarantined?"""
        return self.bridge.skips(step)

    def parameters(self) -> list[torch.Tensor]:
        """What the framework's optimizers train."""
        return [p for o in self.optimizers() for g in o.param_groups for p in g["params"] if p.requires_grad]

    def hold(self) -> None:
        """Keep what the step's update would change (once a step: every micro-batch may call it)."""
        if self._held is not None:
            return
        params, scaler = self.parameters(), self.bridge.scaler
        self._held = _Held(
            params=params,
            weights=[p.detach().clone() for p in params],
            optimizers=[copy.deepcopy(o.state_dict()) for o in self.optimizers()],
            scale=scaler.state_dict() if scaler is not None else None,
        )

    def zero_gradients(self) -> None:
        """Every trained parameter's gradient zero (and no forward), for a framework whose
        `training_step` does the backward itself (transformers)."""
        self.hold()
        for p in self.parameters():
            p.grad = torch.zeros_like(p)

    def zero_loss(self) -> torch.Tensor:
        """A loss whose backward gives every trained parameter a zero gradient (and no forward)."""
        self.hold()
        return torch.stack([(p * 0).sum() for p in self.parameters()]).sum()

    def take_back(self) -> None:
        """Undo the update of the quarantined step that just ended (nothing after any other step)."""
        held, self._held = self._held, None
        if held is None:
            return
        with torch.no_grad():
            for p, value in zip(held.params, held.weights, strict=True):
                p.copy_(value)
        for optimizer, state in zip(self.optimizers(), held.optimizers, strict=True):
            state["param_groups"] = optimizer.state_dict()["param_groups"]  # the schedule's LR has moved on
            optimizer.load_state_dict(state)
        if held.scale is not None and self.bridge.scaler is not None:
            self.bridge.scaler.load_state_dict(held.scale)
