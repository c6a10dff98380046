"""Recovery: the one owner of what happens after trouble in an attempt.

It holds the data rung and its attempt machine (session.skipping, session.machine), the fp32
replay (session.replay) and the state they roll back to before the first checkpoint
(session.rollback.FreshStart), and how the loop is rolled back: in place, or, for a loop
whose state the session does not hold (the framework adapters), by re-entering it from a
checkpoint; and a smaller micro-batch after running out of device memory (session.memory). The
Session hands it the loop's step function (`arm`), each step to run (`run_step`) and, at the
end, a fault no rung handled (`judge`): every recovery decision is taken here, never by the Session."""

from __future__ import annotations

import time
from typing import Any

import torch

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.launch import AttemptLaunch, InPlaceChanges
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.report import InPlaceChange, Replay
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.session.catch_up import CloseStep
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.inplace import InPlace
from mpjob_trainer.session.memory import Reshape, SmallerMicroBatch, release_cached
from mpjob_trainer.session.replay import Fp32Replay, LiveWeights
from mpjob_trainer.session.rollback import FreshStart, Target, restore
from mpjob_trainer.session.skipping import DataRung
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import SamplesFunction, StepFunction


class Recovery:
    def __init__(
        self,
        guard: GuardSpec,
        context: AttemptContext,
        policy: FaultPolicy | None,
        in_place: InPlace | None = None,
        *,
        launch: AttemptLaunch,
    ) -> None:
        self.context = context
        self.rung = DataRung(guard, context, policy)
        self.rung.in_place = self.in_place = in_place
        if in_place is not None:  # an attempt begun in place judges its steps afresh, as a restarted one does
            in_place.afresh.append(self.rung.afresh)
        self.memory = SmallerMicroBatch(self.rung, in_place, context, launch)
        self.replay: Fp32Replay | None = None
        #: When the attempt's ending was known (Unix seconds; the report's endedAt).
        self.ended_at: float | None = None
        #: A restarted attempt's seconds from its predecessor's end to resumed (`resumed`).
        self.recovered_in: float | None = None
        #: The loop runs through Session.reentering: it may be left to wrap its model anew.
        self.loop_reenters = False
        #: The state the loop, left to be wrapped anew, loads when it re-enters (`reenter`).
        self.reentry: Target | None = None

    @property
    def started_at(self) -> int | None:
        """The start step of the attempt the processes train now, when a change in place began it."""
        return self.in_place.started_at if self.in_place is not None else None

    def resumed(self, since: float | None) -> float | None:
        """The attempt resumed: a restart's recoverySeconds, counted from `since` (the launch's
        recoveringSince: when the attempt before it ended; None: not a recovery)."""
        self.recovered_in = round(max(0.0, time.time() - since), 3) if since is not None else None
        return self.recovered_in

    def account(self, started_at: int | None) -> dict[str, Any]:
        """What the report says of recovery (ending.Standing's fields): where the attempt the
        processes train now began, what it skipped, the replay's verdict, the changes made in place, when the
        ending was known, and the attempt's recoverySeconds (in place: its change's)."""
        return {
            "start_step": self.started_at if self.started_at is not None else started_at,
            "skipped": self.rung.quarantine.reported(),
            "replay": self.replayed,
            "precision_changes": self.changes,
            "ended_at": self.ended_at,
            "recovery_seconds": self.changes[-1].recovery_seconds if self.changes else self.recovered_in,
        }

    @property
    def changes(self) -> list[InPlaceChange]:
        """The fallbacks made in place so far, oldest first."""
        return list(self.in_place.changes) if self.in_place is not None else []

    @property
    def replayed(self) -> Replay | None:
        """The verdict of the replay this attempt made (None: none was made)."""
        return self.replay.replayed if self.replay is not None else None

    def measured(self, changes: InPlaceChanges) -> None:
        """An `auto` attempt measured its precision: it may change in place as `changes` (the
        launch's plan for that precision) says, as an attempt launched in it may."""
        if self.in_place is not None:
            self.in_place.adopt(changes)

    def arm(
        self,
        step: StepFunction,
        samples: SamplesFunction | None,
        *,
        guard: GuardSpec,
        weights: LiveWeights | None,
        state: TrainingState,
        checkpoints: Checkpointer,
        close: CloseStep,
        reshape: Reshape | None = None,
    ) -> None:
        """The loop registered its step (after resume(): it trains what resume() registered): replays
        and rollbacks can run it (`guard`: the settings the parallelism allows,
        sharding.Wrapper.replayable), closing the steps they run again with `close` (the session's),
        and `reshape` changes its split."""
        changes = self.in_place is not None and bool(self.in_place.splits or self.in_place.targets)
        first, needed = checkpoints.last_good is None, bool(guard.replay_steps) or self.rung.rolls_back or changes
        fresh = FreshStart.if_needed(state, self.context.numerics, fresh=first, needed=needed)
        known = self.replay.known if self.replay is not None else None  # a loop that re-entered registers again
        skipped = self.rung.quarantine.skips_step  # not replayed, as the catch-up does not run it
        self.replay = Fp32Replay(
            step, samples, spec=guard, lent=self.context, fresh=fresh, weights=weights, skipped=skipped
        )
        self.replay.known = known  # what this attempt replayed stays replayed
        self.rung.arm(self.replay, state=state, fresh=fresh)
        self.rung.bind(close, state=state, checkpoints=checkpoints)  # a first step's out-of-memory catches up
        if self.in_place is not None:
            self.in_place.why_not = self._not_in_place(state)
            self.in_place.rewraps = state.sharded is not None
        self.memory.arm(reshape)

    def run_step(self, step: int, *, state: TrainingState | None, checkpoints: Checkpointer) -> None:
        """Run the registered step `step` (0-based); out of device memory, in a smaller split in
        place when the launch allows (session.memory)."""
        if self.replay is None:
            raise ConfigError("run_step() runs the step register_step() registered: register it first")
        self.memory.run(self.replay.step, step, state=state, checkpoints=checkpoints)

    # ---------------------------------------------------------------- a loop wrapped anew
    def left_loop(self, target: Target) -> None:
        """The loop was left to wrap its sharded model anew (outcomes.Rewrap): what held its old
        objects lets go of them before it builds new ones, and its resume() loads `target`."""
        self.reentry, self.replay = target, None
        self.rung.replay, self.rung.quarantine.screen = None, None  # armed again by the re-entered loop
        self.context.numerics.precision.release_model()
        release_cached(self.context.numerics.precision.device)

    def reenter(self, state: TrainingState, checkpoints: Checkpointer) -> int:
        """The re-entered loop's resume(): load the state it was left for into its new objects, as
        a restarted attempt's resume loads it (a checkpoint damaged since is passed over for the
        good one before it: rollback.restore), and tell the change; the step it goes on from."""
        assert self.reentry is not None and self.in_place is not None  # only a change made in place leaves
        target, self.reentry, numerics = self.reentry, None, self.context.numerics
        checkpoints.hook(state)
        start = self.in_place.reentered(
            lambda: restore(target, checkpoints=checkpoints, state=state, numerics=numerics, keep_position=False)
        )
        checkpoints.watch(state, numerics)
        return start

    def _not_in_place(self, state: TrainingState | None) -> str | None:
        """Why this loop cannot change precision in place (None: it can)."""
        if state is None or not state.objects:
            return "the session holds none of the loop's state"
        if self.rung.reenters:
            return "a framework's loop re-enters from its checkpoint"
        if state.sharded is not None and not self.loop_reenters:
            return "a sharded model is wrapped for one precision, and the loop does not re-enter to wrap it anew"
        return None

    def judge(
        self, exc: BaseException | None, *, state: TrainingState | None, checkpoints: Checkpointer
    ) -> BaseException | None:
        """What ends the attempt: a numeric fault no rung judged is replayed in fp32 (data or
        precision?); anything else as it is."""
        self.ended_at = time.time()  # before the replay: when the ending was known
        unjudged = self.replay is not None and self.replay.replayed is None  # else the data rung judged it
        if isinstance(exc, NumericFault) and self.replay is not None and state is not None and unjudged:
            exc = self.replay.judge(exc, state=state, checkpoints=checkpoints)
        why = self.in_place.why_restart(exc) if self.in_place is not None else None
        if isinstance(exc, NumericFault) and why is not None:  # the attempt's message says why it restarts
            return NumericFault(exc.rule, f"{exc}; not in place ({why}): the next attempt restarts")
        if isinstance(exc, torch.OutOfMemoryError) and (why := self.memory.why_restart()) is not None:
            first = str(exc).splitlines()[0] if str(exc) else "torch.OutOfMemoryError"
            return torch.OutOfMemoryError(f"{first}; not in place ({why}): the next attempt restarts")
        return exc

    # ---------------------------------------------------------------- a loop that re-enters
    def reenter_on_rollback(self) -> None:
        """The data rung (guard.onBadData skip, guard.spike) then rolls back the session's own
        state, quarantines the offending steps whole, and ends `end_step` with RolledBack: the
        loop re-enters from that checkpoint, training on nothing at a step
        `quarantined.skips_step` names."""
        self.rung.reenters = True

    def checkpoint_start(self, state: TrainingState, step: int, checkpoints: Checkpointer) -> None:
        """At a fresh start (`step` 0, no checkpoint), checkpoint step 0 of `state` (what resume()
        registered) when the data rung may roll back: the state a rollback before the first
        interval's checkpoint returns to (a loop rolled back in place keeps a host copy instead,
        DataRung.arm)."""
        if step or checkpoints.last_good is not None or not self.rung.rolls_back:
            return
        numerics = self.context.numerics
        amp, applied = numerics.precision, numerics.applied.count
        checkpoints.save(0, amp.precision, lambda: state.capture(0, applied, amp.precision, amp.scaler), final=True)
