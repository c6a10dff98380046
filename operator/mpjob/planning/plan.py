"""What a planning decision writes into: a `Plan` (the new status, the attempts to create, the
Jobs to delete or cut, the Events to post), and the moment (`When`) its transitions are
recorded at. The operator's reconcile and `mpjob run` carry a plan out each in their own way."""

from __future__ import annotations

from dataclasses import dataclass, field

from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobStatus


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class When:
    """The moment a transition is recorded at and the spec generation it answers."""

    at: str
    generation: int | None = None


@dataclass(frozen=True)
class Started:
    """Attempt `index` said started (its Events) and counted so (`reason`: why it began), once:
    when its first Job is made (`lifecycle.made`), or as it begins in the running processes
    (`changed.changed_in_place`), which no Job is made for."""

    index: int
    reason: str
    events: tuple[Event, ...]


@dataclass
class Plan:
    status: MixedPrecisionJobStatus
    create: list[StartAttempt] = field(default_factory=list)
    delete: list[int] = field(default_factory=list)  # attempt indexes whose Job (+Service) to delete
    cut: list[int] = field(default_factory=list)  # of those, the ones whose live pods are cut (cutoff)
    events: list[Event] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (from, to): down the ladder after a fault
    repromotions: list[tuple[str, str]] = field(default_factory=list)  # (from, to): back up after clean steps
    #: The attempts said and counted started (`lifecycle.announce`): those begun in place as the
    #: plan is made, then those whose first Job acting on it made (`lifecycle.made`).
    started: list[Started] = field(default_factory=list)
    ended: Event | None = None  # what ended the last attempt (set by `conclude`), for views that narrate it
    #: What is left of runPolicy.activeDeadlineSeconds for the attempts to create (None: no deadline).
    deadline_seconds: int | None = None
    #: Seconds after which the job is to be reconciled again though nothing it watches changes (a
    #: wait that ends then: the next attempt's backoff); None: its changes and ticks are enough.
    requeue_after: float | None = None

    @property
    def told(self) -> list[Event]:
        """Every Event the plan posts: its own, then what the attempts it said started say."""
        return [*self.events, *(e for s in self.started for e in s.events)]
