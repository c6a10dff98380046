"""The clean-step clock of re-promotion (launch.repromoteAfterSteps, fallback attempts only): the
last step of an interval that saw numeric trouble, from which clean steps count.

Checkpoints carry it with the precision they were written in (the reserved key `lastTrouble`): an
attempt that starts from one written in the precision it trains in (restarted after a preemption,
an eviction, a lost node, or begun in place) counts on from it, so a job stopped more often than
every repromoteAfterSteps steps still goes back up; in another precision, or from nothing, it
counts from its start. One of the session's own stateful parts (session.state's `own`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpjob_trainer.session.state import LAST_TROUBLE


class LastTrouble:
    def __init__(self, training_in: Callable[[], str]) -> None:
        #: The precision the attempt trains in now (what a checkpoint's record names).
        self.training_in = training_in
        #: The last step of an interval with numeric trouble (or the attempt's start).
        self.step = 0
        #: The last loaded checkpoint's record (None: none since the last start, or none held).
        self.carried: tuple[int, str] | None = None

    def resumed(self, start: int, *, faulted_at: int | None = None) -> None:
        """An attempt starts at `start` in the precision it trains in, restarted or in place: its clean steps
        go on from the last trouble of the checkpoint it loaded if written in that precision (every step
        since was clean in it; a step past `start`: trouble the steps it runs again are known to meet), else
        (another precision, nothing loaded: a re-promotion in place) from `start`; a fallback's from no
        earlier than the step the attempt before it faulted at (`faulted_at`), which it runs again."""
        carried, self.carried = self.carried, None
        same = carried is not None and carried[1] == self.training_in()
        self.step = max(carried[0] if same and carried is not None else start, faulted_at or 0)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "precision": self.training_in()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.carried = state["step"], state["precision"]

    @staticmethod
    def state_problem(state: Any) -> str | None:
        """What makes a checkpoint's record unusable (None: nothing): {"step": a step from 0, "precision": a name}."""
        usable = isinstance(state, dict) and set(state) == {"step", "precision"} and isinstance(state["precision"], str)
        if not usable or type(state["step"]) is not int or state["step"] < 0:
            return f"a {LAST_TROUBLE} record {state!r:.60}, not {{'step': a step from 0, 'precision': a name}}"
        return None
