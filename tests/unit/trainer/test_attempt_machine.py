"""The attempt machine's transition table (session.machine), pair by pair: every (phase, event)
either moves to the phase written here or raises WrongTransition and stays put."""

from __future__ import annotations

import itertools

import pytest

from mpjob_trainer.session.machine import AttemptMachine, Event, Phase, WrongTransition

pytestmark = pytest.mark.unit

P, E = Phase, Event
#: The recovery paths, written out once more by hand; every pair not here is refused.
EXPECTED = {
    (P.TRAINING, E.FAULT): P.JUDGING,
    (P.TRAINING, E.SPIKE): P.ROLLING_BACK,
    (P.TRAINING, E.OUT_OF_MEMORY): P.ROLLING_BACK,
    (P.CATCHING_UP, E.OUT_OF_MEMORY): P.ROLLING_BACK,
    (P.JUDGING, E.DATA): P.ROLLING_BACK,
    (P.JUDGING, E.RERUN): P.ROLLING_BACK,
    (P.JUDGING, E.FALL_BACK): P.ROLLING_BACK,
    (P.ROLLING_BACK, E.RESTORED): P.CATCHING_UP,
    (P.ROLLING_BACK, E.LEFT_LOOP): P.REENTERING,
    (P.TRAINING, E.LEFT_LOOP): P.REENTERING,
    (P.CATCHING_UP, E.LEFT_LOOP): P.REENTERING,
    (P.CATCHING_UP, E.CAUGHT_UP): P.TRAINING,
    (P.REENTERING, E.REENTERED): P.TRAINING,
    (P.TRAINING, E.END): P.ENDED,
    (P.JUDGING, E.END): P.ENDED,
    (P.ROLLING_BACK, E.END): P.ENDED,
    (P.CATCHING_UP, E.END): P.ENDED,
    (P.REENTERING, E.END): P.ENDED,
}


@pytest.mark.parametrize(("phase", "event"), list(itertools.product(Phase, Event)))
def test_every_phase_and_event_pair(phase: Phase, event: Event) -> None:
    machine = AttemptMachine(phase)
    assert machine.can(event) is ((phase, event) in EXPECTED)
    if (phase, event) in EXPECTED:
        assert machine.fire(event) is EXPECTED[(phase, event)] and machine.phase is EXPECTED[(phase, event)]
    else:
        with pytest.raises(WrongTransition, match=f"cannot take {event.value} in {phase.value}"):
            machine.fire(event)
        assert machine.phase is phase


@pytest.mark.parametrize(
    "path",
    [
        [E.FAULT, E.DATA, E.RESTORED, E.CAUGHT_UP],  # bad data skipped in place
        [E.FAULT, E.RERUN, E.RESTORED, E.CAUGHT_UP],  # a suspect step that was the precision's
        [E.FAULT, E.FALL_BACK, E.RESTORED, E.CAUGHT_UP],  # the precision's fault: the next one, in place
        [E.SPIKE, E.LEFT_LOOP, E.REENTERED],  # a spike under a framework adapter
        [E.FAULT, E.FALL_BACK, E.LEFT_LOOP, E.REENTERED],  # a sharded model's fallback: wrapped anew
        [E.LEFT_LOOP, E.REENTERED],  # a sharded model's re-promotion: wrapped anew
        [E.SPIKE, E.RESTORED, E.LEFT_LOOP, E.REENTERED],  # the same, due at a step a catch-up runs again
        [E.OUT_OF_MEMORY, E.RESTORED, E.OUT_OF_MEMORY, E.RESTORED, E.CAUGHT_UP],  # out of memory twice: two splits
    ],
)
def test_each_recovery_comes_back_to_training_and_ends_once(path: list[Event]) -> None:
    machine = AttemptMachine()
    for event in path:
        machine.fire(event)
    assert machine.phase is P.TRAINING
    machine.fire(E.END)
    with pytest.raises(WrongTransition):
        machine.fire(E.END)  # an attempt ends once
    restored = AttemptMachine()
    restored.load_state_dict(machine.state_dict())
    assert restored.phase is P.ENDED
