"""InPlace: a fallback made in the running processes (spec.precision.inPlace).

When the fp32 replay says the precision is at fault and the job's fault policy says FallBack,
the processes need not end: a numeric fault leaves them healthy. Every rank has the same
verdict (the replay agrees it), so every rank, in step:

1. switches the attempt's precision to the next one the planner allows in place
   (AttemptLaunch.inPlaceTo: autocast's dtype, a GradScaler only for fp16; fp8's linears run
   plain outside fp8; an `auto` attempt's, once it has measured: the launch's inPlaceMeasured
   for the precision it chose, `adopt`);
2. restores the last good state (the checkpoint, else the fresh start's step 0) in it, the
   guard's counters starting afresh as a new attempt's do (with no good state, none loading,
   the switch is taken back and the attempt ends in the precision it trained in: `_rewound_in`);
3. runs the steps from there up to where the loop stands again through the loop's registered
   step, and the loop goes on at its next step.

A fallback target that names a split (microBatch x gradAccumulation: a fallback into fp32 that
splits the micro-batch, precision.fallbackKeepsBatch) hands it to the loop's registered `reshape`
after step 2, so the steps run again in it (session.memory; a model wrapped anew: its loop
re-enters in it, reading the split from the session's spec); a loop that registered none ends the
attempt and restarts as before.

The result is the restart path's, bit for bit: a restarted attempt loads the same checkpoint
(weights, optimizer, scheduler, generators) and its loop runs the same steps. The change is
told three ways (report.InPlaceChange: the new attempt's index, the fault, the seconds from
detection to training again): a `precisionChanged` line, which `mpjob run` records as an
attempt with `inPlace: true`; a series of the metrics endpoint, which the operator records the
same way, the attempt's metrics moving to the new attempt and precision labels; and the
termination report's list, so an operator that read none of it still records every change.

A re-promotion (launch.repromoteAfterSteps clean steps, a checkpoint written) goes back up in
place the same way when the launch names where (promoteInPlaceTo, or the fallback target's
promoteTo): nothing is restored, the state in memory being the checkpoint's (`promote`). When
the target names a split (the full micro-batch a fallback into fp32 split, taken back) the
loop's registered `reshape` takes it from the next step on (session.memory; a model wrapped
anew: its loop re-enters in it); a loop that registered none ends the attempt and restarts as
before. Every rank goes up at the same step (the checkpoint's, after the same clean steps: the
guard's verdicts are agreed), so every rank changes its split there too and the gradient
all-reduce (FSDP2's reduce-scatter) stays in step.

Running out of device memory goes on in place too when the launch names a smaller split
(inPlaceSplits) and the loop registered how to change its own (session.memory): the same
precision, the last good state restored, the loop's data and accumulation in the new split. A
split attempt's own fallbacks go on in place too (the split's inPlaceTo); an out-of-memory after
a change of precision restarts (the planner names splits for the launched precision only).

A sharded model changes precision in place by being wrapped anew (`rewraps`): FSDP2 fixes its
MixedPrecisionPolicy when it wraps, and torch has no setter for it. The loop, run through
Session.reentering (the builtin is), is left (outcomes.Rewrap) and runs again in the same
processes: it builds its model, wraps it in the new precision (and its data in the split the
change names, if any: FSDP2 shards the parameters, not the batch), and its resume() loads the
state a restarted attempt would load (the last good checkpoint, else the fresh start's step 0;
after a re-promotion, the checkpoint just written), verified as it loads: one damaged since its
save is passed over for the good one before it, the attempt then starting there
(NoGoodCheckpoint, an InfraError, when none loads: in the precision it trained in, `reentered`).
The processes, their imports and their process group stay; the change is told once the state is
loaded, its recoverySeconds counting the rebuild.

Not in place (the attempt ends, and the operator restarts it as before): a sharded model whose
loop does not re-enter, a loop that re-enters a framework, a loop that registered no step, and a
change into another split by a loop with no `reshape`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from mpjob_contract.codes import Reason
from mpjob_contract.faults import FaultAction, fault_of
from mpjob_contract.launch import InPlaceChanges, InPlaceSplit, InPlaceTarget
from mpjob_contract.policy import FaultPolicy
from mpjob_contract.report import ChangeKind, InPlaceChange
from mpjob_trainer.errors import NumericFault, Repromote
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.interval import Cadence
from mpjob_trainer.session.modes import Settled
from mpjob_trainer.session.updates import UpdateWatch

#: The loop's data and accumulation in a new split: reshape(micro_batch, grad_accumulation).
Reshape = Callable[[int, int], None]
#: Rolls the state back to the newest good one at or before a step index: its step, or the
#: attempt's ending when there is none.
Rewind = Callable[[int], "int | Exception"]
_Start = TypeVar("_Start", int, "int | Exception")


class InPlace:
    def __init__(
        self, changes: InPlaceChanges, *, attempt: int, policy: FaultPolicy, context: AttemptContext, cadence: Cadence
    ) -> None:
        #: The precisions the next fallbacks go to, in order.
        self.targets: list[InPlaceTarget] = []
        #: The smaller micro-batches the attempt may go on in after running out of device memory.
        self.splits: list[InPlaceSplit] = []
        #: Where the running attempt's re-promotion goes in place (None: it ends the attempt).
        self.promote_to: InPlaceTarget | None = None
        self.adopt(changes)
        #: The attempt the processes train now (the launched one, plus each change made).
        self.attempt = attempt
        self.policy, self.context, self.cadence = policy, context, cadence
        #: Why no change can be made in place in this attempt (None: it can, targets allowing).
        self.why_not: str | None = None
        #: Why no split can be made in place (None: it can, splits allowing; session.memory).
        self.why_not_split: str | None = None
        #: The step the newest in-place attempt started from (None: no change made).
        self.started_at: int | None = None
        #: The changes made, oldest first (the termination report lists them).
        self.changes: list[InPlaceChange] = []
        #: A change is made by the loop re-entering, its model wrapped anew (a sharded model's).
        self.rewraps = False
        #: How the attempt takes another split (session.memory; None: the loop registered no reshape).
        self.resplit: Reshape | None = None
        #: A change made whose loop has not re-entered yet: begun and told by `reentered`.
        self._untold: Callable[[int], None] | None = None
        #: TRAIN as it was before that change (None: it kept its precision): put back if no state loads.
        self._left: Settled | None = None
        #: What else starts afresh with each attempt begun in place (the data rung's verdicts: session.recovery).
        self.afresh: list[Callable[[], None]] = []

    def adopt(self, changes: InPlaceChanges) -> None:
        """The attempt may change in place as `changes` says (the launch's; an `auto` attempt's for
        the precision it measured, once it has)."""
        self.targets, self.splits = list(changes.in_place_to), list(changes.in_place_splits)
        self.promote_to = changes.promote_in_place_to

    def can(self, fault: NumericFault) -> bool:
        """May `fault` (the precision's, by the replay's verdict) be answered in place?"""
        return self._why_not_in(self._next()) is None and self._allowed(fault)

    def why_restart(self, ending: BaseException | None) -> str | None:
        """Why a fallback the launch allows in place ends the attempt instead (the restart path),
        for the attempt's message; None when it is not such a fallback."""
        allowed = isinstance(ending, NumericFault) and self._allowed(ending)
        return self._why_not_in(self._next()) if allowed else None

    def _next(self) -> InPlaceTarget | None:
        """The next fallback's target, if the launch names one."""
        return self.targets[0] if self.targets else None

    def _why_not_in(self, target: InPlaceTarget | None) -> str | None:
        """Why a change to `target` (a fallback's or the re-promotion's) cannot be made in place
        (None: it can): in the split it names, if any, only by the loop's reshape (a model wrapped
        anew too: its loop re-enters in the split, session.memory's spec)."""
        if self.why_not is not None or target is None or target.shape is None:
            return self.why_not
        return "the loop registered no reshape for its micro-batch" if self.resplit is None else None

    def _allowed(self, fault: NumericFault) -> bool:
        """The launch names a precision to change to, and the job's policy falls back on `fault`."""
        kind = fault_of(Reason.NUMERIC_FAULT, str(fault.rule))
        return bool(self.targets) and kind is not None and self.policy.decide(kind).action is FaultAction.FALL_BACK

    def fall_back(self, fault: NumericFault, *, step: int, rewind: Rewind, detected: float) -> int | Exception:
        """Switch to the next precision (and split, if the target names one) and go back to the last
        good state in it: the step to run again from (the data rung catches up to `step`), or the
        ending when there is none (in the precision the attempt trained in)."""
        previous, target = self.context.numerics.precision.precision, self.targets.pop(0)
        start = self._rewound_in(target.precision, rewind, step - 1)
        if isinstance(start, Exception):
            return start
        if target.shape is not None:  # the steps from `start` run again in it
            assert self.resplit is not None  # can() said so
            self.resplit(*target.shape)
        self.splits = []  # planned for the precision it leaves
        self.context.metrics.trip(fault.rule)
        message = f"{fault.rule}: {fault}"  # as the restart path's report words it
        self._told("fallback", step, start, target, previous, target.precision, rule=str(fault.rule), message=message,
                   since=detected, shape=target.shape)  # fmt: skip
        return start

    def _rewound_in(self, precision: str, rewind: Rewind, before: int) -> int | Exception:
        """Go back to the last good state at or before step index `before`, loaded in `precision`
        (as a restarted attempt loads it: fp16's scale only from an fp16 checkpoint). With none to
        go back to (none loads: NoGoodCheckpoint), the attempt ends in the precision it trained in,
        as it was: its report names that one, not one it never trained in."""
        left = self.context.numerics.precision.settle(precision)
        start = self._loaded(left, lambda: rewind(before))
        self._left = left if self.rewraps and isinstance(start, int) else None  # found only: `reentered` loads it
        return start

    def _loaded(self, left: Settled | None, load: Callable[[], _Start]) -> _Start:
        """`load` the state a change goes on from; with none (an ending returned, NoGoodCheckpoint
        raised) TRAIN goes back to `left` (what the change's settle left; None: nothing changed)."""
        try:
            start = load()
        except BaseException:
            if left is not None:
                self.context.numerics.precision.unsettle(left)
            raise
        if isinstance(start, Exception) and left is not None:
            self.context.numerics.precision.unsettle(left)
        return start

    def can_split(self) -> bool:
        """May the attempt go on in a smaller micro-batch in place after running out of device memory?"""
        return self.why_not is None and self.why_not_split is None and bool(self.splits)

    def split(self, *, step: int, start: int, message: str, detected: float) -> InPlaceSplit:
        """Go on as the next attempt in the next smaller split, in the same precision, from step
        `start` (the last good state, restored), with the fallbacks the planner allows that
        attempt in place (the split's inPlaceTo); its clean steps go on from the attempt's last trouble."""
        target, precision = self.splits.pop(0), self.context.numerics.precision.precision
        self._begin(target, start, faulted_at=self.cadence.trouble_at.step)
        self.targets = list(target.in_place_to)
        rule = Reason.OUT_OF_DEVICE_MEMORY.value
        self._tell("microBatch", step, start, precision, precision, rule=rule, message=message, since=detected,
                   shape=(target.micro_batch, target.grad_accumulation))  # fmt: skip
        return target

    def can_promote(self) -> bool:
        """May the attempt's re-promotion, due now, be made in place (in the split it names, if any:
        by the loop's reshape, not for a model wrapped anew)?"""
        return self.promote_to is not None and self._why_not_in(self.promote_to) is None

    def promote(self, why: Repromote, *, step: int) -> None:
        """Go back up to the precision the planner re-promotes to, from the checkpoint just written
        at `step`: the state in memory is that checkpoint's, so nothing is restored (its clean steps
        count from `step`, not from a record a rollback loaded before). Its own fallbacks are the ones
        the planner allows it in place (the target's inPlaceTo; the planner bars re-promoting a
        precision that faults again). A split it names is the loop's from the next step on."""
        assert self.promote_to is not None  # can_promote() said so
        detected, previous, target = time.monotonic(), self.context.numerics.precision.precision, self.promote_to
        left = self.context.numerics.precision.settle(target.precision)
        self._left = left if self.rewraps else None  # the re-entered loop loads that checkpoint (`reentered`)
        if target.shape is not None:
            assert self.resplit is not None  # can_promote() said so
            self.resplit(*target.shape)
        self.targets, self.splits, self.cadence.trouble_at.carried = list(target.in_place_to), [], None
        self._told("repromote", step, step, target, previous, target.precision, rule="repromote", message=str(why),
                   since=detected, shape=target.shape)  # fmt: skip

    def reentered(self, load: Callable[[], int]) -> int:
        """The loop re-entered, its model wrapped anew: `load` the change's state (its step), and the
        change is told now, its recoverySeconds counting the rebuild. A start before the change's
        (its checkpoint no longer loaded: the good one before it did) is the attempt's start. With
        none that loads, the precision is taken back, as `_rewound_in` takes it back: the attempt
        ends in the precision it trained in (the switch was made before the loop left, to wrap in it)."""
        left, self._left = self._left, None
        start = self._loaded(left, load)
        untold, self._untold = self._untold, None
        if untold is not None:
            untold(start)
        if start != self.started_at:
            self.context.numerics.guard.restart_at(start)
            self.cadence.trouble(start)
            self.started_at = start
        return start

    def _told(self, kind: ChangeKind, step: int, start: int, target: InPlaceTarget, *args: Any, **kwargs: Any) -> None:
        """`_begin` the attempt in `target` and `_tell` the change now, or both once the loop re-entered (from the
        step it loaded) when the model is wrapped anew: with none that loads, the attempt ends as it trained."""

        def made(begun: int) -> None:  # a fallback that may go back up counts clean steps from `step`, as launched
            self._begin(target, begun, faulted_at=step if kind == "fallback" and target.repromote_after_steps else None)
            self._tell(kind, step, begun, *args, **kwargs)

        if self.rewraps:
            self._untold = made
        else:
            made(start)

    def _begin(self, target: InPlaceTarget | InPlaceSplit, start: int, *, faulted_at: int | None = None) -> None:
        """The processes go on as the next attempt, in `target`, from step `start`: the guard, the
        steps it trained without an update (session.updates: every step of a restarted attempt
        overflow-skipped is its fault, whatever the attempt before it applied), the quality gate's
        streak, the clean-step count and what `afresh` holds (the data rung's suspect and replay
        verdicts) start afresh and its re-promotion is the planner's, as a restarted attempt's are."""
        self.context.numerics.guard.restart_at(start)
        self.context.numerics.updates = UpdateWatch()
        self.cadence.begin(start, faulted_at=faulted_at)
        self.cadence.repromote_after = target.repromote_after_steps
        self.promote_to = target.promote_to
        self.attempt, self.started_at = self.attempt + 1, start
        for begin in self.afresh:
            begin()

    def _tell(
        self, kind: ChangeKind, step: int, start: int, previous: str, to: str,
        *, rule: str, message: str, since: float, shape: tuple[int, int] | None = None,
    ) -> None:  # fmt: skip
        """The change just made, three ways: the report's list, the metrics' series, the event
        line (`since`: when it was due, the monotonic clock's; `shape`: the split it took, if another)."""
        change = InPlaceChange(
            kind=kind,
            attempt=self.attempt,
            step=step,
            start_step=start,
            from_precision=previous,  # type: ignore[arg-type]
            to_precision=to,  # type: ignore[arg-type]
            rule=rule,
            message=message,
            recovery_seconds=round(time.monotonic() - since, 3),
            at=round(time.time(), 3),
            micro_batch=shape[0] if shape is not None else None,
            grad_accumulation=shape[1] if shape is not None else None,
        )
        self.changes.append(change)
        self.context.metrics.changed(change)
        self.context.log("precisionChanged", **change.model_dump(by_alias=True))
