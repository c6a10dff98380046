"""ReEntry: the Session's calls for a loop that is rolled back by re-entering it from a
checkpoint instead of in place (the framework adapters: HF Trainer and Lightning keep their
model, optimizer and data to themselves), apart so session.run reads as the phases."""

from __future__ import annotations

from mpjob_contract.api import Precision
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.skipping import DataRung
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import StepNumerics


class ReEntry:
    """Mixed into Session, which provides these attributes."""

    _rung: DataRung
    _state: TrainingState | None
    _step: int
    _amp: AttemptPrecision
    _numerics: StepNumerics
    _checkpoints: Checkpointer

    @property
    def precision(self) -> Precision:
        raise NotImplementedError

    def reenter_on_rollback(self) -> None:
        """The loop cannot be rolled back in place, but re-enters from a checkpoint. The data rung
        (guard.onBadData skip, guard.spike) then rolls back the session's own state, quarantines
        the offending steps whole, and raises RolledBack out of `end_step`: the loop re-enters from
        that checkpoint, training on nothing at a step `quarantined.skips_step` names."""
        self._rung.reenters = True

    def checkpoint_start(self) -> None:
        """At a fresh start of a loop that re-enters (reenter_on_rollback), checkpoint step 0 when
        the data rung may roll back: the state a rollback before the first interval's checkpoint
        returns to (a loop rolled back in place keeps a host copy instead, DataRung.arm). Call it
        inside the loop, once the loop's own state (a framework's optimizer) exists."""
        state, amp = self._state, self._amp
        if state is None or self._step or self._checkpoints.last_good is not None or not self._rung.rolls_back:
            return
        applied = self._numerics.applied.count
        self._checkpoints.save(
            0, self.precision, lambda: state.capture(0, applied, amp.precision, amp.scaler), final=True
        )
