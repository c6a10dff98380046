"""AttemptContext: what the session lends the parts that work on its attempt (the fp32 replay,
the data rung, the precision measurement), one object for all of them."""

from __future__ import annotations

from dataclasses import dataclass

from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.steps import StepNumerics


@dataclass(frozen=True)
class AttemptContext:
    #: The guard, the precision state (its modes: session.modes) and the step's numbers.
    numerics: StepNumerics
    world: World
    log: EventLog
    metrics: TrainerMetrics
