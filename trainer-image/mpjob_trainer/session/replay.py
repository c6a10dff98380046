"""Fp32Replay: before a precision is given up, replay the faulting steps in fp32 (F1/F2 vs bad data).

The reference article's runbook says "rerun a small subset in FP32 to isolate". When the
numeric guard ends a precision, the session reloads the last good checkpoint, switches to
fp32 (the REPLAY mode of session.modes: no autocast, no GradScaler) and replays, with the
same samples, the optimizer steps that end at the first faulting one (at most
precision.guard.replaySteps of them; the steps between the checkpoint and the first of those
are skipped, so the replay starts from the checkpoint's weights), checking each step's loss
and gradient norm on the host:

- all finite: the precision is at fault -> exit 42 as ever, and the ladder goes on;
- one non-finite: the data or the model is at fault -> exit 45 (NonFiniteInFp32), naming the
  step and its samples, and the job fails without spending attempts on other precisions;
- no replay possible (no step function registered, no checkpoint and non-finite weights in
  memory, an error, or past replayTimeoutSeconds): inconclusive -> the precision is blamed,
  as before replays existed.

Without a checkpoint before the fault (a fault in the first interval), the weights in memory
are used when they are finite (GradScaler never applies an overflowing step), and only the
first faulting step is replayed. Under DDP every rank replays (the step function's collectives
run as in training) and each step's verdict is all-reduced, so all ranks agree.

Cost: one checkpoint load plus at most replaySteps fp32 steps, once per ended precision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.report import Replay
from mpjob_trainer.distributed import World, all_reduce_max
from mpjob_trainer.errors import NonFiniteInFp32, NumericFault
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.modes import Mode
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import SamplesFunction, StepFunction, StepNumerics

#: Samples named in a report at most (the report must stay under Kubernetes' 4 KiB).
MAX_NAMED_SAMPLES = 32


@dataclass(frozen=True)
class Window:
    """The steps to replay (0-based optimizer step indexes) and where their weights come from."""

    first_fault: int
    steps: range
    from_checkpoint: bool


def window(first_fault: int, *, checkpoint_step: int | None, replay_steps: int) -> Window:
    """Up to `replay_steps` steps ending at the first faulting one, not before the checkpoint."""
    if checkpoint_step is None or checkpoint_step > first_fault:
        return Window(first_fault, range(first_fault, first_fault + 1), from_checkpoint=False)
    start = max(checkpoint_step, first_fault - replay_steps + 1)
    return Window(first_fault, range(start, first_fault + 1), from_checkpoint=True)


def agreed_bad(bad: bool, world: World, device: torch.device) -> bool:
    """Did any rank see a non-finite value? Every rank gets the same answer."""
    return bool(all_reduce_max(torch.tensor(float(bad), device=device), world).item() > 0)


@dataclass(frozen=True)
class Replaying:
    """What a replay works with, lent by the session for the attempt."""

    #: The guard (where the trouble began), the precision state (the replay runs in its REPLAY
    #: mode, session.modes) and the step's numbers (was the replayed step finite?).
    numerics: StepNumerics
    world: World
    log: EventLog
    metrics: TrainerMetrics


class Fp32Replay:
    """The loop's step function and sample lookup, and the verdict of replaying them."""

    def __init__(
        self, step: StepFunction, samples: SamplesFunction | None, *, spec: GuardSpec, lent: Replaying
    ) -> None:
        self.step = step
        self.samples = samples
        self.spec = spec
        self.lent = lent
        #: The verdict of the replay this attempt made (None: none was made), for its report.
        self.replayed: Replay | None = None

    def judge(self, fault: NumericFault, *, state: TrainingState, checkpoints: Checkpointer) -> Exception:
        """What ends the attempt after `fault`: the fault, told what fp32 said, or NonFiniteInFp32
        (an fp32 attempt's fault is its own: there is nothing safer to replay it in)."""
        if self.lent.numerics.precision.precision == "fp32":
            return fault
        replay = self.run(fault, state=state, checkpoints=checkpoints)
        if replay is None:
            return fault
        self.replayed = replay
        self.lent.metrics.replayed(replay.verdict, replay.seconds)
        return ending_for(fault, replay)

    def run(self, fault: NumericFault, *, state: TrainingState, checkpoints: Checkpointer) -> Replay | None:
        """Replay the steps that led to `fault` in fp32 from `checkpoints`' last good one into
        `state`; None when replays are off or the rule does not point at steps."""
        lent = self.lent
        first = lent.numerics.guard.first_fault_step(fault.rule) if self.spec.replay_steps else None
        if first is None:
            return None
        ref = checkpoints.last_good
        win = window(first, checkpoint_step=ref.step if ref else None, replay_steps=self.spec.replay_steps)
        try:
            if win.from_checkpoint and ref is not None:
                state.restore(checkpoints.state_of(ref), "fp32", None)
            elif not state.finite():
                lent.log("replaySkipped", why=f"no checkpoint before step {first} and non-finite weights in memory")
                return inconclusive(first)
            lent.numerics.tally.clear()
            with lent.numerics.precision.entered(Mode.REPLAY):
                replay = self._judge(win)
        except Exception as exc:  # e.g. fp32 needs more memory than there is: the precision stays blamed
            lent.log("replaySkipped", why=f"{type(exc).__name__}: {exc}", all_ranks=True)
            return inconclusive(first)
        lent.log("replay", **replay.model_dump(by_alias=True, exclude_none=True))
        return replay

    def _judge(self, win: Window) -> Replay:
        """Each step of the window in turn, until one is non-finite on any rank."""
        world, device, tally = self.lent.world, self.lent.numerics.precision.device, self.lent.numerics.tally
        began = time.monotonic()
        for index in win.steps:
            if agreed_bad(time.monotonic() - began > self.spec.replay_timeout_seconds, world, device):
                return _verdict("inconclusive", win, began, steps=index - win.steps.start)
            self.step(index)
            if agreed_bad(not tally.finite_and_clear(grad_norm=True), world, device):
                named = self.samples(index)[:MAX_NAMED_SAMPLES] if self.samples is not None else []
                return _verdict("data", win, began, steps=index - win.steps.start + 1, at=index, samples=named)
        return _verdict("precision", win, began, steps=len(win.steps))


def _verdict(
    verdict: str, win: Window, began: float, *, steps: int, at: int | None = None, samples: list[int] | None = None
) -> Replay:
    return Replay(
        verdict=verdict,
        first_step=win.first_fault,
        steps=steps,
        from_checkpoint=win.from_checkpoint,
        offending_step=at,
        samples=samples or [],
        seconds=round(time.monotonic() - began, 3),
    )


def inconclusive(first_fault: int) -> Replay:
    """No replay could be made: the precision is blamed, as before replays existed."""
    return Replay(verdict="inconclusive", first_step=first_fault)


def ending_for(fault: NumericFault, replay: Replay) -> Exception:
    """What ends the attempt after the replay: NonFiniteInFp32, or the fault, told what fp32 said."""
    message = describe(replay, f"{fault.rule}: {fault}")
    if replay.verdict == "data":
        return NonFiniteInFp32(message)
    return NumericFault(fault.rule, message.removeprefix(f"{fault.rule}: "))


def describe(replay: Replay, rule_message: str) -> str:
    """The human message of an attempt that ended after a replay."""
    if replay.verdict == "data":
        shown = ", ".join(str(i) for i in replay.samples)
        origin = "the last good checkpoint" if replay.from_checkpoint else "the weights before the fault"
        return (
            f"{rule_message}; replayed in fp32 from {origin}, step {replay.offending_step} is "
            f"non-finite too: the data or the model is at fault, not the precision (samples of that step "
            f"on this process: [{shown}])"
        )
    if replay.verdict == "precision":
        first = replay.first_step - replay.steps + 1
        return f"{rule_message}; fp32 replayed steps {first}-{replay.first_step} finitely: the precision is at fault"
    return f"{rule_message}; no fp32 replay could tell (inconclusive)"
