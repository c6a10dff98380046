"""RecordedSteps: what a framework adapter needs to give the session a step function.

The session runs the loop's step itself for the fp32 replay (session.replay) and the quality
gate (session.quality): `step(i)` must run optimizer step i again, on its own samples. A
framework's loop cannot be asked for step i (its data order is its own), so the adapters
keep the micro-batches of the most recent steps exactly as the framework fed them
(references to the tensors it made anyway: no copy, no sync) and re-run the framework's own
forward on them under the session's autocast, then `run.backward` and `run.step` on the
framework's optimizer, as a loop on the SDK does.

What is kept: `keep` steps (spec: max(training.logEvery, guard.maxConsecutiveOverflows)
plus guard.replaySteps), enough for the faulting step of a fault the guard sees at the next
read after it, or an overflow storm it sees as it happens. A fault found further back (a
MaxNonFiniteLosses limit above 1 reached over several reads) has had its batches dropped:
the replay then says so and is inconclusive. The adapters replay from the weights in memory
while they are finite (GradScaler kept an fp16 fault out of them), so only the first faulting
step is replayed; when the fault was applied (bf16, fp32), from the framework's own checkpoint
inside the last good mpjob checkpoint (`FrameworkWeights`: model and optimizer, read with
`weights_only`), a fresh start's step-0 checkpoint before the first interval's.

While the session runs a step itself, recording pauses (`replaying`), so the framework's
hooks do not take the replay's batches or losses for training's.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint.protocol import Store
from mpjob_trainer.session.framework import framework_folder
from mpjob_trainer.session.state import all_finite, model_tensors


class BatchesGone(LookupError):
    """The session asked for a step whose micro-batches are no longer kept."""


def steps_to_keep(spec: MixedPrecisionJobSpec) -> int:
    """Enough steps for the first faulting one of a fault found at the next read (see above)."""
    guard = spec.precision.guard
    return max(spec.training.log_every, guard.max_consecutive_overflows) + guard.replay_steps


class RecordedSteps:
    """The micro-batches of the last `keep` optimizer steps (0-based indexes), as fed."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.replaying = False
        self._steps: OrderedDict[int, list[Any]] = OrderedDict()

    def add(self, index: int, batch: Any) -> None:
        """Micro-batch `batch` of optimizer step `index` (ignored while the session runs a step)."""
        if self.replaying:
            return
        self._steps.setdefault(index, []).append(batch)
        self._steps.move_to_end(index)
        while len(self._steps) > self.keep:
            self._steps.popitem(last=False)

    def clear(self) -> None:
        """Forget every step (the framework re-enters from a checkpoint: its steps run again)."""
        self._steps.clear()

    def batches(self, index: int) -> list[Any]:
        """The micro-batches of step `index`."""
        if index not in self._steps:
            held = f"steps {min(self._steps)}-{max(self._steps)}" if self._steps else "none"
            raise BatchesGone(f"the micro-batches of step {index} are no longer held (held: {held})")
        return self._steps[index]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Run the block (a step the session runs itself) without recording it."""
        self.replaying = True
        try:
            yield
        finally:
            self.replaying = False


def loss_of(output: Any) -> Any:
    """The loss a framework's step returned: a tensor, a mapping's "loss", or an output's `.loss`."""
    if isinstance(output, dict) or hasattr(output, "keys"):
        return output["loss"]
    return getattr(output, "loss", output)


class NonFiniteWeights(ValueError):
    """The weights in memory are not finite: a replay from them could tell nothing."""


def weights_finite(model: torch.nn.Module) -> None:
    """Raise NonFiniteWeights unless `model`'s weights and buffers are finite (state.model_tensors;
    one sync, this rank's: replays only)."""
    if not all_finite(model_tensors([model]), agree=False):
        raise NonFiniteWeights("the weights in memory are not finite (the fault was applied): no fp32 replay from them")


@dataclass(frozen=True)
class FrameworkWeights:
    """A framework's live weights for the fp32 replay (session.replay.LiveWeights): `read` loads
    the framework's checkpoint folder (in a checkpoint of `store`) into its model and optimizer."""

    model: torch.nn.Module
    read: Callable[[Path], None]
    store: Store[Any]

    def finite(self) -> bool:
        """This rank's (the replay agrees): its weights and buffers, as a checkpoint holds them."""
        return all_finite(model_tensors([self.model]), agree=False)

    def load(self, ref: CheckpointRef) -> None:
        self.read(framework_folder(self.store, ref))
