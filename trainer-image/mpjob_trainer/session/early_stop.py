"""EarlyStop: a run that ended before spec.training.steps on its own decision (an early-stopping
callback, a framework's time limit, a loop's own criterion) stays ended.

The loop tells the session before it closes its last step (`Session.stop_early`); that step is
then the run's last: its interval logs and checkpoints it as the last step of spec.training.steps
is (session.interval), and the checkpoint records the stop under a reserved key (`STOPPED_EARLY`).
A retry that resumes from that checkpoint (the attempt crashed after it) finds the run finished
(`Session.finished`) and trains nothing more: a framework asked to train again would forget the
stop (the Hugging Face Trainer resets `should_training_stop` when train() begins, Lightning its
`should_stop`) and train on past where the user wanted it to end. A checkpoint written before this
record existed has none: its run did not stop early.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mpjob_trainer.errors import ConfigError

if TYPE_CHECKING:  # session.interval's Cadence holds the EarlyStop
    from mpjob_trainer.session.interval import Cadence

#: The checkpoint's key for the stop (a reserved key of session.state).
STOPPED_EARLY = "stoppedEarly"


def whole_step(call: str, step: object) -> None:
    """An optimizer step's number is an int (a numpy integer, a tensor or a float would reach the
    event lines and the checkpoints' folder names, and fail there): else a ConfigError naming `call`."""
    if not isinstance(step, int) or isinstance(step, bool):
        raise ConfigError(
            f"{call}({step!r}): a step is an int (a {type(step).__name__} here), the 1-based number of an "
            "optimizer step; pass int(step)"
        )


class EarlyStop:
    """The step a run stopped early after (None: it did not); one of the session's own stateful parts."""

    def __init__(self) -> None:
        self.step: int | None = None

    def at(self, step: int) -> bool:
        """Did the run stop early after step `step`?"""
        return self.step is not None and self.step == step

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]

    def state_problem(self, state: Any) -> str | None:
        """What makes a checkpoint's record unusable (None: nothing): it is {"step": a step or None}."""
        if not isinstance(state, dict) or set(state) != {"step"}:
            return f"a {STOPPED_EARLY} record {state!r:.60}, not {{'step': a step or None}}"
        step = state["step"]
        if step is not None and (type(step) is not int or step < 1):
            return f"a {STOPPED_EARLY} step {step!r:.40}, not a step (an integer from 1)"
        return None


class StopCalls:
    """The Session's calls of an early stop (see above), and of how its steps are numbered."""

    _cadence: Cadence
    _step: int

    @property
    def total_steps(self) -> int:
        """spec.training.steps."""
        return self._cadence.total

    def stop_early(self, step: int) -> None:
        """The loop stops after step `step` (1-based), short of spec.training.steps, on its own
        decision: call it before `end_step(step)`, whose checkpoint is then the run's last and
        records the stop. At spec.training.steps it changes nothing: the run ends there anyway."""
        whole_step("stop_early", step)
        if not self._step < step <= self.total_steps:
            raise ConfigError(
                f"stop_early({step}): the loop can stop after a step it has not closed yet (it closed {self._step}), "
                f"up to spec.training.steps={self.total_steps}; call it before that step's end_step"
            )
        if step < self.total_steps:
            self._cadence.early.step = step

    def framework_numbers_steps(self) -> None:
        """A framework numbers the steps end_step closes (FrameworkRun): any step above the last is the
        next (Lightning's global step counts each optimizer's step), not only the one after it."""
        self._cadence.framework_numbered = True

    @property
    def stopped_early(self) -> bool:
        """Did the run stop early after the step it stands at (stop_early, or its checkpoint's record)?"""
        return self._cadence.early.at(self._step)

    @property
    def finished(self) -> bool:
        """Is nothing left to train: the run stands at spec.training.steps, or stopped early there?
        After resume(): a retry of a run that ended (and crashed after its last checkpoint)."""
        return self._step >= self.total_steps or self.stopped_early
