"""DataRung: bad data and loss spikes cost a rollback, not the run (guard.onBadData, guard.spike).

When the fp32 replay (session.replay) says the data is at fault (the step is non-finite in
fp32 too), or a finite loss spikes (mpjob_trainer.spike), this rung keeps the attempt in its
precision:

1. roll the state back to the last good one (session.rollback: a checkpoint, or a fresh
   attempt's step 0 kept on the host);
2. quarantine the offending steps' samples (mpjob_trainer.quarantine: all ranks', narrowed to the
   ones non-finite alone when the loop gave a screen), or the steps when it names none;
3. run the steps from there up to where the loop stands again, through the loop's registered
   step function (which leaves quarantined samples out), so the loop goes on at its own next
   step as if the skipped samples had never been in the data.

Each step of a recovery is a transition of the attempt machine (session.machine). A
re-promotion that may be made in place (session.inplace) is made here too, where a step closes
(a catch-up's too).

A loop that cannot be rolled back in place (a framework adapter: HF Trainer and Lightning keep
their model, optimizer, schedule and data to themselves) re-enters instead (`reenters`): step 1
and 2 as above (the session's own state, from the checkpoint's state.pt), then RolledBack
leaves the loop, and the adapter re-enters its framework from that checkpoint's framework
checkpoint, its batch stream as before, a quarantined step training on nothing (the
framework cannot name samples: the step is quarantined whole).

The result equals a straight run whose quarantine held those samples from the start: steps before
the offending one never saw them; a rollback restores every state exactly. Bounded by
guard.maxSkippedSteps; past it the attempt ends NonFiniteInFp32, naming the steps. Triggers, at an
interval's one read: with replays on, a non-finite loss below the guard's bound (fp16's GradScaler
would skip it, the sample still in the data) is "suspect" and replayed at once; a suspect step fp32
finds finite is the precision's: rolled back and run again (nothing changes), no further suspect
is raised in this attempt, and its verdict judges a guard fault on its steps (Fp32Replay.known).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.faults import GuardRule
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.skipping import SkipCause, describe_steps, ranges
from mpjob_trainer.errors import NonFiniteInFp32, NumericFault, Repromote
from mpjob_trainer.quarantine import REPORT_RANGES, Quarantine
from mpjob_trainer.session.catch_up import CloseStep, Position, ScheduleCounts, catch_up
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.inplace import InPlace
from mpjob_trainer.session.machine import AttemptMachine, Event, Phase
from mpjob_trainer.session.outcomes import LossSpiked, Rewrap, RolledBack, SuspectSteps
from mpjob_trainer.session.policy import trainer_actions
from mpjob_trainer.session.replay import Fp32Replay
from mpjob_trainer.session.rollback import FreshStart, Target, roll_back
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import Number, Read
from mpjob_trainer.spike import SpikeDetector


class DataRung:
    def __init__(self, spec: GuardSpec, lent: AttemptContext, policy: FaultPolicy | None = None) -> None:
        self.spec, self.lent = spec, lent
        self.quarantine = Quarantine()
        self.quarantine.watcher = self._show
        #: What bad data and a spike do: the guard's settings, or the job's faultPolicy rule on them.
        self.skips_bad_data, self.on_spike = trainer_actions(spec, policy or FaultPolicy())
        #: Where a recovery stands (session.machine): every step of one goes through it.
        self.machine = AttemptMachine()
        self.spike: SpikeDetector | None = None
        if self.on_spike != "off":
            self.spike = SpikeDetector(spec.spike, lent.numerics.precision.device)
            lent.numerics.guard.spike = self.spike
        self.replay: Fp32Replay | None = None
        #: The loop re-enters from a checkpoint instead of being rolled back in place (a
        #: framework adapter; Session.reenter_on_rollback): a rollback ends in RolledBack.
        self.reenters = False
        self._fresh: FreshStart | None = None
        self._close: CloseStep | None = None  # the session's, as `closing` was last given it
        self._rolled_back: Target | None = None  # what `rewind` restored last
        self._reentry: Target | None = None  # found to be loaded by the loop wrapped anew (`rewind`)
        self._counts = ScheduleCounts({})  # the loop's LR schedulers where it stood (`recover`)
        self._precision_suspected = False
        #: Samples of one optimizer step (all ranks; Session.end_step's), what a step skipped
        #: whole counts in mpjob_trainer_skipped_samples_total and the quarantine's summary.
        self.step_samples = 0
        #: Falls back in the running processes when the precision is at fault (session.inplace).
        self.in_place: InPlace | None = None

    def stateful(self) -> dict[str, Any]:
        """What checkpoints hold of the rung (TrainingState's reserved keys)."""
        return {"quarantine": self.quarantine, **({"spike": self.spike} if self.spike is not None else {})}

    def arm(self, replay: Fp32Replay, *, state: TrainingState | None, fresh: FreshStart | None) -> None:
        """The loop registered its step; `fresh` is a fresh attempt's step 0, the state to roll
        back to before the first checkpoint.

        A loop whose state the session does not hold is armed only when it re-enters from a
        checkpoint (`reenters`: the framework adapters); otherwise a data verdict ends the
        attempt as with onBadData fail, and a spike is logged only."""
        if state is None or not (state.objects or self.reenters):
            return
        self.replay = replay
        self._fresh = fresh

    def _show(self) -> None:
        """The quarantine on the metrics endpoint (the operator's live status.skipped)."""
        self.lent.metrics.quarantined(self.quarantine.summary(spans=REPORT_RANGES))

    @property
    def rolls_back(self) -> bool:
        """May this rung roll the state back (bad data skipped, or spikes rolled back)?"""
        return self.skips_bad_data or self.on_spike == "rollback"

    def closing(
        self, step: int, loss: Number | None, samples: int | None, *,
        close: CloseStep, state: TrainingState | None, checkpoints: Checkpointer,
    ) -> Exception | None:  # fmt: skip
        """Close step `step` (trained on `samples`) with `close` (the session's); a fault the rung handles
        is recovered from and the step closed again, now on the re-run step's own loss. What ends the step
        otherwise (the attempt's ending, RolledBack, Preempted, ...) is returned."""
        closed = self.bind(close, state=state, checkpoints=checkpoints)
        if self.machine.phase is Phase.REENTERING:  # the loop re-entered and closes its first step
            self.machine.fire(Event.REENTERED)
        while True:
            outcome = closed(step, loss, samples)
            if not isinstance(outcome, NumericFault) or state is None:
                return outcome
            told = state.told_stop()  # recovering loads a checkpoint's record, older than the stop the loop told
            if (ending := self.recover(outcome, step=step, state=state, checkpoints=checkpoints)) is not None:
                return ending
            told()  # caught up: the loop's step closes again as the loop told it, now on the re-run step's loss
            loss = None

    def bind(self, close: CloseStep, *, state: TrainingState | None, checkpoints: Checkpointer) -> CloseStep:
        """A catch-up closes the steps it runs again with `close` (the session's), as the loop's are:
        bound when the loop registers its step (a first step may catch up), again at each end_step."""
        self._close = functools.partial(self._closed, close, state=state, checkpoints=checkpoints)
        return self._close

    def _closed(
        self, close: CloseStep, step: int, loss: Number | None, samples: int | None, *,
        state: TrainingState | None, checkpoints: Checkpointer,
    ) -> Exception | None:  # fmt: skip
        """`close` step `step`; a re-promotion due there goes up in place when it may (session.inplace),
        at the loop's step and at a catch-up's alike: the checkpoint at `step` is written and the state
        in memory is its, so the steps after it train on in the precision gone up to (a sharded model's
        loop leaves, to be wrapped anew from that checkpoint)."""
        outcome = close(step, loss, samples)
        if not (isinstance(outcome, Repromote) and self.in_place is not None and self.in_place.can_promote()):
            return outcome
        self.in_place.promote(outcome, step=step)
        if not self.in_place.rewraps or state is None:
            return None
        start = self.rewind(step, state=state, checkpoints=checkpoints, wrap_anew=True)  # that checkpoint
        return start if isinstance(start, Exception) else self.go_on(start, step, state=state)

    def inspect(self, step: int, read: Read) -> NumericFault | None:
        """What the rung handles, seen at an interval's read: a spike, or a non-finite loss the
        guard would let pass (suspect: replayed at once)."""
        spikes = read.guard.spikes
        if spikes is not None and self.spike is not None:
            self.lent.log("lossSpike", firstStep=spikes[0], lastStep=spikes[-1], detectedAt=step)
            self.spike.forget_spikes()
            if self.on_spike == "end" or self.replay is not None:  # else nothing to run again: seen only
                return LossSpiked(spikes, step)
        guard = self.lent.numerics.guard
        counted = read.guard.held
        suspect = guard.new_non_finite > 0 and counted < guard.spec.max_non_finite_losses and self.skips_bad_data
        if suspect and self.replay is not None and self.replay.enabled and not self._precision_suspected:
            return SuspectSteps(GuardRule.MAX_NON_FINITE_LOSSES, f"a non-finite loss by step {step}")
        return None

    def recover(
        self, fault: NumericFault, *, step: int, state: TrainingState, checkpoints: Checkpointer
    ) -> Exception | None:
        """Roll back, skip and catch up to `step` (1-based, where the loop stands): None, or a
        fault met while catching up; else what ends the attempt when the rung cannot go on, or
        RolledBack for a loop that re-enters."""
        self._counts = ScheduleCounts(state.objects, self.quarantine)  # where the loop stands, before a load
        if isinstance(fault, LossSpiked) and self.on_spike == "end":
            return self._ended(fault)  # the job's faultPolicy ends the attempt on a spike (FallBack or Fail)
        if isinstance(fault, LossSpiked):
            self.machine.fire(Event.SPIKE)
            return self._skip(list(fault.steps), "spike", step=step, state=state, checkpoints=checkpoints)
        detected, in_place = time.monotonic(), self.in_place is not None and self.in_place.can(fault)
        if self.replay is None or not (self.skips_bad_data or in_place):
            return self._ended(fault)
        self.machine.fire(Event.FAULT)
        ending = self.replay.judge(fault, state=state, checkpoints=checkpoints)
        verdict = self.replay.replayed
        data = isinstance(ending, NonFiniteInFp32) and verdict is not None and verdict.offending_step is not None
        if data and self.skips_bad_data:
            assert verdict is not None and verdict.offending_step is not None
            self.replay.replayed = None
            self.machine.fire(Event.DATA)
            return self._skip([verdict.offending_step], "data", step=step, state=state, checkpoints=checkpoints)
        if not isinstance(fault, SuspectSteps) and isinstance(ending, NumericFault) and in_place:
            assert self.in_place is not None
            self.machine.fire(Event.FALL_BACK)
            self.afresh()  # at once, before the rewind (InPlace._begin repeats it for every change)
            wrap_anew = self.in_place.rewraps  # a sharded model: the loop re-enters, wrapped in the next precision
            rewind = functools.partial(self.rewind, state=state, checkpoints=checkpoints, wrap_anew=wrap_anew)
            start = self.in_place.fall_back(ending, step=step, rewind=rewind, detected=detected)
            return start if isinstance(start, Exception) else self.go_on(start, step, state=state)
        if not isinstance(fault, SuspectSteps):
            return self._ended(ending)
        self._precision_suspected = True  # the precision's: today's bounds decide from here
        self.replay.replayed = None  # judged: its verdict stays known for its steps (Fp32Replay.known)
        self.machine.fire(Event.RERUN)
        start = self.rewind(step - 1, state=state, checkpoints=checkpoints)
        return start if isinstance(start, Exception) else self.go_on(start, step, state=state)

    def afresh(self) -> None:
        """A new attempt begins in place (session.inplace: a fallback, a re-promotion, a split): its steps are
        judged afresh, as a restarted attempt's are. A suspect the attempt before found to be its precision's
        says nothing of the next precision: a later one is replayed again, and bad data is still quarantined."""
        if self.replay is not None:
            self.replay.replayed, self.replay.known = None, None
        self._precision_suspected = False

    def _ended(self, ending: Exception) -> Exception:
        """The attempt ends with `ending` (returned to the session, which raises it to the loop)."""
        self.machine.fire(Event.END)
        return ending

    def _skip(
        self, steps: list[int], cause: SkipCause, *, step: int, state: TrainingState, checkpoints: Checkpointer
    ) -> Exception | None:
        if again := sorted(set(steps) & self.quarantine.served_again(cause)):
            seen = "is non-finite in fp32" if cause == "data" else "spikes"
            why = f"step {describe_steps(again[:1])} {seen} again after it was skipped: the loop "
            why += "does not leave quarantined samples out (run.quarantined, docs/sdk.md), so skipping cannot help"
            return self._ended(NonFiniteInFp32(why))
        if len(already := self.quarantine.steps) + len(steps) > self.spec.max_skipped_steps:
            shown = describe_steps([*already, *steps])
            why = f"{cause} at step(s) {shown}: more than guard.maxSkippedSteps={self.spec.max_skipped_steps} "
            why += "steps to skip; the data or the model is at fault, not the precision"
            return self._ended(NonFiniteInFp32(why))
        forgiven = self.lent.numerics.guard.forgiven
        start = self.rewind(min(steps), state=state, checkpoints=checkpoints)
        if isinstance(start, Exception):
            return start
        self.lent.metrics.forgave(self.lent.numerics.guard.forgiven - forgiven)
        assert self.replay is not None  # armed: a rung that skips has a replay
        named = [self.replay.samples_named(s, cause, self.quarantine.screen) for s in steps]  # at the restored weights
        for index, samples in zip(steps, named, strict=True):
            record = self.quarantine.add(index, cause, samples, whole=self.step_samples)
            self.lent.metrics.skipped(cause, record.size)
        spans = ranges([i for samples in named for i in samples])
        self.lent.log(
            "dataSkipped",
            cause=cause,
            steps=steps,
            samples=[r.model_dump() for r in spans],
            fromStep=start,
            skippedSteps=len(self.quarantine),
            quarantine=self.quarantine.summary(spans=REPORT_RANGES).model_dump(by_alias=True),
        )
        return self.go_on(start, step, state=state)

    def go_on(self, start: int, step: int, *, state: TrainingState) -> Exception | None:
        """After a rollback to `start`: run steps start..step-1 (0-based) again in place, each closed as
        end_step closes it, the last by the loop's own (session.catch_up): None, or what ended one on the
        way; or leave the loop to re-enter (RolledBack; Rewrap, to be wrapped anew from `rewind`'s target)."""
        counts, self._counts = self._counts, ScheduleCounts({})  # checked once, after the recovery it began
        if self._reentry is not None:
            left, self._reentry = Rewrap(self._reentry), None
            self.machine.fire(Event.LEFT_LOOP)
            return left
        if self.reenters:
            assert self._rolled_back is not None and self._rolled_back.ref is not None  # no in-memory start state
            self.machine.fire(Event.LEFT_LOOP)
            return RolledBack(self._rolled_back.ref)
        self.machine.fire(Event.RESTORED)
        assert self.replay is not None and self._close is not None and self._rolled_back is not None  # armed, rewound
        # Each step run again closes at its own data position, counted on from the restored state's.
        told, at = self.step_samples or None, Position(state, self._rolled_back.samples)  # None: never told
        fault = catch_up(self.replay, self._close, self.quarantine, start=start, step=step, samples=told, position=at)
        fault = fault if fault is not None else counts.unmatched(start=start, step=step)
        if not isinstance(fault, Rewrap):  # else re-promoted on the way, and left to be wrapped anew
            self.machine.fire(Event.CAUGHT_UP)
        return fault

    def rewind(
        self, before: int, *, state: TrainingState, checkpoints: Checkpointer, wrap_anew: bool = False
    ) -> int | Exception:
        """Restore the newest good state at or before step index `before`: its step, or the
        attempt's ending when there is none. `wrap_anew`: found, not loaded; the loop leaves
        (`go_on`) and its resume() loads it into the objects it builds anew (session.inplace)."""
        numerics, keep, load = self.lent.numerics, not self.reenters, not wrap_anew  # unloadable: passed over
        target = roll_back(before, checkpoints, state, numerics, fresh=self._fresh, keep_position=keep, load=load)
        if target is None:
            return self._ended(NonFiniteInFp32(f"no good state before step {before} to roll back to (no checkpoint)"))
        self._rolled_back = target
        if wrap_anew:
            self._reentry = target
        elif self.spike is not None:
            self.spike.forget_spikes()
        return target.step
