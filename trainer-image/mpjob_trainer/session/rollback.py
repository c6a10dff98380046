"""FreshStart: a rollback target exists before the first checkpoint.

A fresh attempt copies its state once, before its first step, to the host (a sharded model's
shards where they are: at a fresh start they are 1/N of the weights and the optimizer holds
nothing yet). While no checkpoint exists, a fault rolls back to it (the data rung) and the fp32
replay starts from it: a bad record in a fresh run's first steps is then told from a precision
fault, and skipped, whatever checkpoint.everySteps says. Without it, a bf16 step on a bad record
leaves non-finite weights, no replay can start, and the record costs the precision (and, in
fp32, the job).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from mpjob_contract.report import CheckpointRef
from mpjob_trainer.distributed import World, is_dtensor
from mpjob_trainer.session.agreement import main_says
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import StepNumerics


class FreshStart:
    """The state of step 0 of a fresh attempt, untouched by training."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @classmethod
    def if_needed(
        cls, state: TrainingState | None, numerics: StepNumerics, *, fresh: bool, needed: bool
    ) -> FreshStart | None:
        """Step 0 of a fresh attempt whose session holds its state, when a replay or a rollback
        may need it (`needed`); None otherwise (a resumed attempt has its checkpoint)."""
        if state is None or not state.objects or not fresh or not needed:
            return None
        return cls.kept(state, numerics)

    @classmethod
    def kept(cls, state: TrainingState, numerics: StepNumerics) -> FreshStart:
        """Copy `state` as it stands (the attempt's step 0) to the host."""
        precision, scaler = numerics.precision.precision, numerics.precision.scaler
        return cls(host_copy(state.capture(0, numerics.applied.count, precision, scaler, in_memory=True)))


@dataclass(frozen=True)
class Target:
    """A state to roll back to: its step, the state, and its checkpoint (None: the fresh start).
    A checkpoint's state is read when it is loaded (`roll_back`), not here: {}."""

    step: int
    state: dict[str, Any]
    ref: CheckpointRef | None
    #: Its data position (TrainingState.samples), once `roll_back` loaded it: where a catch-up
    #: from it counts each step's samples on from.
    samples: int = 0


def rollback_target(before: int, *, checkpoints: Checkpointer, world: World, fresh: FreshStart | None) -> Target | None:
    """The newest good state at or before step index `before`: the last good checkpoint, else a
    fresh attempt's step 0 (None: neither). A save still being written counts (the rollback
    point does not depend on the disk's speed), and every rank takes rank 0's checkpoint (only
    rank 0 collects asynchronous saves). The checkpoint is only named: whoever loads it
    (`roll_back`) verifies it then, and passes over one damaged since. A collective."""
    checkpoints.collect(block=True, training_step=before + 1)
    ref = main_says(checkpoints.last_good, world)
    if ref is not None and ref.step <= before:
        return Target(ref.step, {}, ref)
    if fresh is not None:
        return Target(fresh.step, fresh.state, None)
    return None


def roll_back(
    before: int,
    checkpoints: Checkpointer,
    state: TrainingState,
    numerics: StepNumerics,
    *,
    fresh: FreshStart | None,
    keep_position: bool,
    load: bool = True,
) -> Target | None:
    """Load the newest good state at or before step index `before` into `state` (as `restore`):
    the last good checkpoint, else a fresh attempt's step 0 (None: neither). A checkpoint damaged
    since, or that does not load, is rejected for the one before it, as on resume
    (Checkpointer.reload; NoGoodCheckpoint when none loads). Not `load`: only found
    (`rollback_target`), for a loop that loads it itself. A collective."""
    if not load:
        return rollback_target(before, checkpoints=checkpoints, world=checkpoints.world, fresh=fresh)
    checkpoints.collect(block=True, training_step=before + 1)
    seen, amp = state.samples, numerics.precision
    loaded = checkpoints.reload(state, before, amp.precision, amp.scaler)
    if loaded is not None:
        target = Target(loaded[0].step, {}, loaded[0])
        numerics.applied.count = loaded[1]
    elif fresh is not None:
        target = Target(fresh.step, fresh.state, None)
        numerics.applied.count = state.restore(fresh.state, amp.precision, amp.scaler)
    else:
        return None
    target = replace(target, samples=state.samples)
    if keep_position:
        state.samples = seen
    _rewound(target.step, numerics)
    return target


def restore(
    target: Target, *, checkpoints: Checkpointer, state: TrainingState, numerics: StepNumerics, keep_position: bool
) -> int:
    """Load `target` into the session's objects and numerics: the step it loaded. A checkpoint is
    loaded as `roll_back` loads it (verified again: one damaged since, or that does not load, is
    passed over for the one before it; NoGoodCheckpoint when none loads). `keep_position`: the data
    position stays where the loop stands (a loop caught up in place re-runs the same positions,
    quarantined samples left out, and a later checkpoint must say so); a loop that re-enters runs
    them again itself, counting from the target's position. A collective."""
    if target.ref is not None:
        loaded = roll_back(target.step, checkpoints, state, numerics, fresh=None, keep_position=keep_position)
        assert loaded is not None  # rank 0's last good checkpoint: the target's, or one before it
        return loaded.step
    seen = state.samples
    numerics.applied.count = state.restore(target.state, numerics.precision.precision, numerics.precision.scaler)
    if keep_position:
        state.samples = seen
    _rewound(target.step, numerics)
    return target.step


def _rewound(step: int, numerics: StepNumerics) -> None:
    """The guard back at `step`, and nothing of the steps after it counted."""
    numerics.guard.rewind(step)
    numerics.guard.begin_step()  # the replay's optimizer steps are not the loop's
    numerics.tally.clear()


def host_copy(value: Any) -> Any:
    """A copy of a captured state on the host that training does not change. A sharded
    model's shards are copied where they are: a DTensor's mesh names its device."""
    if is_dtensor(value):
        return value.detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(host_copy(v) for v in value)
    return value
