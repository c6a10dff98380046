"""The attempt machine: where a recovery stands, as one state and a written transition table.

The data rung (session.skipping) moves it; a transition the table does not hold raises
`WrongTransition` (a bug, never a user's fault), so a recovery can neither start inside
another nor end twice.

    Training --Fault--> Judging          a fault the rung may handle: the fp32 replay judges it
    Training --Spike--> RollingBack      a loss spike to roll back and skip
    Training --OutOfMemory--> RollingBack a smaller micro-batch, in place (session.memory)
    Judging --Data--> RollingBack        the data is at fault: quarantine and roll back
    Judging --Rerun--> RollingBack       a suspect step was the precision's: roll back, run again
    Judging --FallBack--> RollingBack    the precision is at fault: the next one, in place (session.inplace)
    RollingBack --Restored--> CatchingUp the rollback target is loaded; run the steps again
    CatchingUp --OutOfMemory--> RollingBack  out of memory again, catching up: the next split
    RollingBack --LeftLoop--> Reentering the loop re-enters from the checkpoint (adapters), or
                                         wrapped anew in the next precision (a sharded model)
    Training --LeftLoop--> Reentering    a sharded model re-promoted in place is wrapped anew
    CatchingUp --LeftLoop--> Reentering  the same, re-promoted at a step it runs again
    CatchingUp --CaughtUp--> Training
    Reentering --Reentered--> Training   the re-entered loop closes its first step
    any but Ended --End--> Ended         the attempt ends (a verdict, a bound, an error)
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    TRAINING = "Training"
    JUDGING = "Judging"
    ROLLING_BACK = "RollingBack"
    CATCHING_UP = "CatchingUp"
    REENTERING = "Reentering"
    ENDED = "Ended"


class Event(StrEnum):
    FAULT = "Fault"
    SPIKE = "Spike"
    OUT_OF_MEMORY = "OutOfMemory"
    DATA = "Data"
    RERUN = "Rerun"
    FALL_BACK = "FallBack"
    RESTORED = "Restored"
    LEFT_LOOP = "LeftLoop"
    CAUGHT_UP = "CaughtUp"
    REENTERED = "Reentered"
    END = "End"


TRANSITIONS: dict[tuple[Phase, Event], Phase] = {
    (Phase.TRAINING, Event.FAULT): Phase.JUDGING,
    (Phase.TRAINING, Event.SPIKE): Phase.ROLLING_BACK,
    (Phase.TRAINING, Event.OUT_OF_MEMORY): Phase.ROLLING_BACK,
    (Phase.JUDGING, Event.DATA): Phase.ROLLING_BACK,
    (Phase.JUDGING, Event.RERUN): Phase.ROLLING_BACK,
    (Phase.JUDGING, Event.FALL_BACK): Phase.ROLLING_BACK,
    (Phase.ROLLING_BACK, Event.RESTORED): Phase.CATCHING_UP,
    (Phase.ROLLING_BACK, Event.LEFT_LOOP): Phase.REENTERING,
    (Phase.TRAINING, Event.LEFT_LOOP): Phase.REENTERING,
    (Phase.CATCHING_UP, Event.LEFT_LOOP): Phase.REENTERING,
    (Phase.CATCHING_UP, Event.CAUGHT_UP): Phase.TRAINING,
    (Phase.CATCHING_UP, Event.OUT_OF_MEMORY): Phase.ROLLING_BACK,
    (Phase.REENTERING, Event.REENTERED): Phase.TRAINING,
    **{(phase, Event.END): Phase.ENDED for phase in Phase if phase is not Phase.ENDED},
}


class WrongTransition(RuntimeError):
    """`event` in `phase`: the table holds no such transition."""

    def __init__(self, phase: Phase, event: Event) -> None:
        super().__init__(f"the attempt machine cannot take {event.value} in {phase.value}")
        self.phase, self.event = phase, event


class AttemptMachine:
    """One attempt's recovery state; `fire` is the only way it moves."""

    def __init__(self, phase: Phase = Phase.TRAINING) -> None:
        self.phase = phase

    def fire(self, event: Event) -> Phase:
        """Take `event`: the new phase, or WrongTransition when the table has none."""
        nxt = TRANSITIONS.get((self.phase, event))
        if nxt is None:
            raise WrongTransition(self.phase, event)
        self.phase = nxt
        return nxt

    def can(self, event: Event) -> bool:
        return (self.phase, event) in TRANSITIONS

    def state_dict(self) -> dict[str, Any]:
        return {"phase": self.phase.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = Phase(state["phase"])
