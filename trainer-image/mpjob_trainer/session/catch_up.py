"""Catching up after a rollback in place (session.skipping; a fallback in place, session.inplace):
the steps from the restored state up to where the loop stands are run again through the loop's
registered step, and each is closed as the loop's own `end_step` closes it, its interval work
included: at a log step its step line and metrics (the series of `mpjob run` and the metrics
endpoint show the steps run again, as a restarted attempt's loop shows them), the guard's checks,
the quality gate, a checkpoint, SIGTERM. What ends one of them ends the catching up there, and the
attempt with it at that step: its report names the step reached, not the loop's it was catching up to.

Only the registered step runs again: an LR scheduler the loop steps around it would stay where the
checkpoint left it, and every step after would train on a shifted schedule, silently. So the
registered schedulers' counts are taken where the loop stood when its step was found at fault,
before a replay or a rollback loads a checkpoint (ScheduleCounts), and a catch-up that does not bring
them back there ends the attempt a ConfigError naming them. (An out-of-memory in place runs the
failed step itself again, the loop's own step() included: not checked.)"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from mpjob_trainer.errors import ConfigError
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.replay import Fp32Replay
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import Number

#: The session's closing of step `step` (1-based; its loss, None: the losses backward() was given;
#: the samples it trained on, all ranks', None: not told): what ends it, if anything (session.closing).
CloseStep = Callable[[int, Number | None, int | None], Exception | None]


def catch_up(
    replay: Fp32Replay,
    close: CloseStep,
    quarantine: Quarantine,
    *,
    start: int,
    step: int,
    samples: int | None,
    position: Position,
) -> Exception | None:
    """Run steps start..step-1 (0-based) again through `replay`'s registered step (a quarantined
    one trains on nothing, and counts as the loop's own end_step counts it) and close each but the
    last, which the loop's end_step closes, each on `samples` (a step's, as the loop tells them) at
    its own data `position`: None, or what ended one (a fault the guard saw; Preempted; Repromote,
    when not made in place)."""
    try:
        for index in range(start, step):
            if not quarantine.skips_step(index):
                replay.step(index)
            if index + 1 < step:
                position.counted(samples)
                if (ending := close(index + 1, None, samples)) is not None:
                    return ending  # the attempt ends at that step, at its position
    except BaseException:
        position.the_loops()  # a step that raised (out of memory) is recovered from where the loop stands
        raise
    position.the_loops()
    return None


class Position:
    """The data position (TrainingState.samples) while a catch-up runs. The rollback kept the loop's
    (session.rollback, keep_position), yet a checkpoint written at a step run again (an interval's, a
    preemption's, a re-promotion's) must hold that step's: a resume from it draws the samples after
    that step next (data.Origin), not those after the loop's. So each step closed counts its samples on
    from the restored state's position, as end_step counts the loop's; once caught up it is the loop's."""

    def __init__(self, state: TrainingState, restored: int) -> None:
        self.state, self.loop = state, state.samples
        state.samples = restored

    def counted(self, samples: int | None) -> None:
        self.state.samples += samples or 0

    def the_loops(self) -> None:
        """The position back where the loop stands."""
        self.state.samples = self.loop


class ScheduleCounts:
    """The registered LR schedulers' step counts (`last_epoch`) where the loop stands, taken before
    a replay or a rollback; ReduceLROnPlateau counts the metrics it was given, not steps, and is left out.
    A step the recovery skips whole (`quarantine`: the loop names no samples) is one the catch-up runs
    no step for, as a restarted attempt's loop skips it (docs/sdk.md): a scheduler stepped inside the
    registered step comes back one count short of the loop for each such step it had run."""

    def __init__(self, objects: Mapping[str, Any], quarantine: Quarantine | None = None) -> None:
        self.objects = {name: obj for name, obj in objects.items() if counts_steps(obj)}
        self.before = {name: int(obj.last_epoch) for name, obj in self.objects.items()}
        self.quarantine = quarantine
        self.whole_before = frozenset(_skipped_whole(quarantine))

    def unmatched(self, *, start: int, step: int) -> ConfigError | None:
        """After a catch-up of steps start..step-1 (0-based): the ConfigError naming a scheduler the
        registered step did not bring back to where the loop had it, or None."""
        newly = [i for i in _skipped_whole(self.quarantine) if start <= i < step and i not in self.whole_before]
        for name, obj in self.objects.items():
            if int(obj.last_epoch) != self.before[name] - len(newly):
                less = f" less the {len(newly)} step(s) now skipped whole" if newly else ""
                return ConfigError(
                    f"{name}: steps {start + 1} to {step}, run again through the function given to "
                    f"run.register_step after a rollback to step {start}, left this LR scheduler at "
                    f"last_epoch {obj.last_epoch}, where the loop had it at {self.before[name]}{less}: the loop "
                    "steps it outside that function, so the steps after would train on a shifted schedule. "
                    "Call its step() inside the registered step (docs/sdk.md, register_step)"
                )
        return None


def _skipped_whole(quarantine: Quarantine | None) -> list[int]:
    """The steps (0-based) `quarantine` skips whole."""
    return [] if quarantine is None else [i for i in quarantine.steps if quarantine.skips_step(i)]


def counts_steps(obj: object) -> bool:
    """An LR scheduler stepped once per optimizer step (or per epoch) by the loop."""
    scheduler = torch.optim.lr_scheduler
    return isinstance(obj, scheduler.LRScheduler) and not isinstance(obj, scheduler.ReduceLROnPlateau)
