"""Fp32Replay: before a precision is given up, replay the faulting steps in fp32 (F1/F2 vs bad data).

The reference article's runbook says "rerun a small subset in FP32 to isolate". When the
numeric guard ends a precision, the session reloads the last good checkpoint, switches to
fp32 (the REPLAY mode of session.modes: no autocast, no GradScaler) and replays, with the
same samples, the optimizer steps that end at the first faulting one (at most
precision.guard.replaySteps of them; the steps between the checkpoint and the first of those
are skipped, so the replay starts from the checkpoint's weights, generators and applied-step
count, one more for each update it applies, as training counted them), checking each step's
loss and gradient norm on the host:

- all finite: the precision is at fault -> exit 42 as ever, and the ladder goes on;
- one non-finite: the data or the model is at fault -> exit 45 (NonFiniteInFp32), naming the
  step and its samples, and the job fails without spending attempts on other precisions;
- no replay possible (no step function registered, no checkpoint and non-finite weights in
  memory, an error, or past replayTimeoutSeconds): inconclusive -> the precision is blamed,
  as before replays existed. A checkpoint that does not load (damaged since its save) is no
  failed replay: it is passed over for the one before it, as on resume (Checkpointer.back_to; a
  framework's as the session's own); with none the attempt ends NoGoodCheckpoint (an InfraError,
  retried in the same precision).

Without a checkpoint before the fault (a fault before the first checkpoint), the weights in
memory are used when they are finite (GradScaler never applies an overflowing step), and only
the first faulting step is replayed; when the fault left them non-finite (bf16 and fp32 apply
every step), a fresh attempt replays from its step 0 (session.rollback: the state kept on the
host before the first step) as from a checkpoint at step 0. The replay never moves the data
position (the loop's): a rollback after it keeps the position the loop stands at.

Several processes (DDP): every rank replays, and every rank reaches the same verdict
(session.agreement). The ranks start from rank 0's last good checkpoint (only rank 0 learns
of asynchronous saves), replay the same steps with the step function's own collectives
(DDP's gradient all-reduce, as in training), and after each step all-reduce one row of
flags per rank (local loss non-finite, gradient non-finite, the step raised, past the time
cap): one collective per step, and every rank stops at the same step. The replay keeps DDP's
gradient sync rather than `no_sync`: a multi-step replay then applies the very updates
training applied (per-rank gradients would let the replicas' weights drift apart after the
first step, and the session does not own the user's DDP module or its other collectives).
The rank is still told: a rank's loss is computed before any collective, so a non-finite
local loss names its rank; a gradient that went non-finite while every loss stayed finite
was all-reduced before anyone could see whose share it was, and names every rank that saw it.
The verdict names those ranks and their samples of that step (dataset indices, gathered
from the ranks). A rank whose step raises (out of memory on one device) breaks that step's collectives for
the others: they see the process group fail, and every rank ends inconclusive.

Cost: one checkpoint load plus at most replaySteps fp32 steps, once per ended precision.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.report import CheckpointRef, Replay
from mpjob_contract.skipping import SkipCause
from mpjob_trainer.checkpoint.resume import NoGoodCheckpoint
from mpjob_trainer.errors import NumericFault
from mpjob_trainer.quarantine import ScreenFunction
from mpjob_trainer.session.agreement import RankTable, main_says
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.modes import Mode
from mpjob_trainer.session.naming import StepSamples
from mpjob_trainer.session.rollback import FreshStart
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import SamplesFunction, StepFunction
from mpjob_trainer.session.tally import finite
from mpjob_trainer.session.verdict import Offending, Window, ending_for, inconclusive, listed, verdict_of


class LiveWeights(Protocol):
    """The weights of a loop whose state the session does not hold (a framework adapter's):
    are they finite, and load a checkpoint's (the framework's own inside it) into them."""

    def finite(self) -> bool: ...

    def load(self, ref: CheckpointRef) -> None: ...


def window(first_fault: int, *, checkpoint_step: int | None, replay_steps: int, after: int = -1) -> Window:
    """Up to `replay_steps` steps ending at the first faulting one, not before the checkpoint,
    nor at or before step `after` (replayed already in this attempt)."""
    if checkpoint_step is None or checkpoint_step > first_fault:
        return Window(first_fault, range(first_fault, first_fault + 1), from_checkpoint=False)
    start = max(checkpoint_step, first_fault - replay_steps + 1, after + 1)
    return Window(first_fault, range(start, first_fault + 1), from_checkpoint=True)


class Fp32Replay:
    """The loop's step function and sample lookup, and the verdict of replaying them."""

    def __init__(
        self,
        step: StepFunction,
        samples: SamplesFunction | None,
        *,
        spec: GuardSpec,
        lent: AttemptContext,
        fresh: FreshStart | None = None,
        weights: LiveWeights | None = None,
        skipped: Callable[[int], bool] = lambda _: False,
    ) -> None:
        #: The loop's step; and is a step skipped whole (quarantined, its loop naming no samples)? (never replayed)
        self.step, self.skipped = step, skipped
        #: A framework's weights: replayed from its checkpoint when the fault left them non-finite.
        self.weights = weights
        #: A fresh attempt's step 0: where the replay starts while no checkpoint exists.
        self.fresh = fresh
        #: Which samples a step trained on, on every rank (the loop's `samples`; session.naming).
        self.named = StepSamples(samples, lent.world)
        self.spec = spec
        self.lent = lent
        #: The verdict of the replay this attempt made (None: none was made), for its report.
        self.replayed: Replay | None = None
        #: A data verdict's step, ranks and every one of their samples (the report caps them).
        self.offending: Offending | None = None
        #: This attempt's last replay that ran steps and found none non-finite (None: none): a
        #: precision verdict, or an inconclusive one (past the time cap, a step raised). A later
        #: fault that begins at or before its first step is judged by it without a second
        #: replay, and a later replay starts after it (no step is replayed twice).
        self.known: Replay | None = None

    @property
    def enabled(self) -> bool:
        """Are replays on (guard.replaySteps above 0)? Off, no fault is replayed."""
        return self.spec.replay_steps > 0

    def judge(self, fault: NumericFault, *, state: TrainingState, checkpoints: Checkpointer) -> Exception:
        """What ends the attempt after `fault`: the fault, told what fp32 said, or NonFiniteInFp32.
        An fp32 attempt's non-finite step needs no replay: fp32 is what a replay would run, so the
        step's data or the model is at fault. A fault judged once (a framework adapter judges it
        before its loop is torn down) stays judged."""
        if self.replayed is not None:
            return fault
        if (known := self._known_for(fault)) is not None:
            self.replayed = known
            return ending_for(fault, known)
        if self.lent.numerics.precision.precision == "fp32":
            replay = self._in_fp32_already(fault)
        else:
            replay = self.run(fault, state=state, checkpoints=checkpoints)
        if replay is None:
            return fault
        self.replayed = replay
        self.known = replay if replay.verdict != "data" and replay.steps else self.known
        self.lent.metrics.replayed(replay.verdict, replay.seconds)
        return ending_for(fault, replay)

    def _known_for(self, fault: NumericFault) -> Replay | None:
        """The verdict of a replay of `fault`'s first faulting step made already (a collective
        when there is one to ask about)."""
        if self.known is None:
            return None
        first = self.lent.numerics.guard.first_fault_step(fault.rule)
        return self.known if first is not None and first <= self.known.first_step else None

    def _in_fp32_already(self, fault: NumericFault) -> Replay | None:
        """The data verdict of an fp32 attempt's first faulting step, naming the ranks whose loss (else gradient) was
        non-finite there and their samples (None: replays are off, or the rule points at no step). A collective."""
        guard = self.lent.numerics.guard
        first = guard.first_fault_step(fault.rule) if self.enabled else None
        if first is None:
            return None
        self.offending = self.named.offending_where(first, guard.own_loss, guard.own_first, guard.device)
        win = Window(first, range(first, first + 1), from_checkpoint=False)
        replay = verdict_of("data", win, time.monotonic(), steps=0, offending=self.offending)
        self.lent.log("replay", all_ranks=True, **replay.model_dump(by_alias=True, exclude_none=True))
        return replay

    def run(self, fault: NumericFault, *, state: TrainingState, checkpoints: Checkpointer) -> Replay | None:
        """Replay the steps that led to `fault` in fp32 from the last good checkpoint (rank 0's,
        on every rank) into `state`; None when replays are off or the rule does not point at
        steps. A collective: every rank calls it."""
        lent = self.lent
        first = lent.numerics.guard.first_fault_step(fault.rule) if self.enabled else None
        if first is None:
            return None
        # A framework adapter's session holds no objects (the weights are in the framework's own
        # checkpoint): it replays from the weights in memory while they are finite (GradScaler
        # kept the fault out), else from the framework's checkpoint (bf16 applied the fault).
        restorable = bool(state.objects) or self._weights_spoilt()
        if restorable:  # a save staged before the fault may still be writing: it is the newest good state
            checkpoints.settle(lent.numerics.guard.read_at or first)
        ref: CheckpointRef | None = main_says(checkpoints.last_good, lent.world) if restorable else None
        # No checkpoint yet and weights the fault made non-finite (no GradScaler kept them): the
        # fresh attempt's step 0 stands in for a checkpoint.
        fresh = self.fresh if restorable and ref is None and not state.finite() else None
        start = ref.step if ref else (fresh.step if fresh else None)
        after = self.known.first_step if self.known is not None else -1
        win = window(first, checkpoint_step=start, replay_steps=self.spec.replay_steps, after=after)
        # Where the loop's data stands and the steps it applied: a replay moves neither (it counts
        # its own applied steps from its start's, for a loop whose schedule follows applied_steps).
        position, applied = state.samples, lent.numerics.applied
        counted = applied.count
        try:
            return self._replayed(win, ref, state=state, checkpoints=checkpoints)
        finally:
            state.samples, applied.count = position, counted

    def _weights_spoilt(self) -> bool:
        """Did the fault leave a framework's weights non-finite on some rank? (A collective when
        there are such weights.)"""
        if self.weights is None:
            return False
        spoilt = {"spoilt": not self.weights.finite()}
        return RankTable.agree(spoilt, self.lent.world, self.lent.numerics.precision.device).any("spoilt")

    def _replayed(
        self, win: Window, ref: CheckpointRef | None, *, state: TrainingState, checkpoints: Checkpointer
    ) -> Replay:
        lent, first = self.lent, win.first_fault
        win, why = self._prepare(win, ref, state=state, checkpoints=checkpoints)
        if why is not None:
            lent.log("replaySkipped", why=why, all_ranks=True)
            return inconclusive(first)
        try:
            lent.numerics.tally.clear()
            with lent.numerics.precision.entered(Mode.REPLAY), lent.numerics.tally.set_aside():
                replay = self._judge(win)
        except Exception as exc:  # e.g. the process group broke under another rank's error
            lent.log("replaySkipped", why=f"{type(exc).__name__}: {exc}", all_ranks=True)
            return inconclusive(first)
        lent.log("replay", all_ranks=True, **replay.model_dump(by_alias=True, exclude_none=True))  # each rank's word
        return replay

    def _prepare(
        self, win: Window, ref: CheckpointRef | None, *, state: TrainingState, checkpoints: Checkpointer
    ) -> tuple[Window, str | None]:
        """Load the window's starting weights on every rank: the window from the checkpoint that
        loaded, and why no replay can be made, if so (the same answer on every rank). A checkpoint
        that does not load is the checkpoint's fault, not the precision's: the one before it is
        taken (Checkpointer.back_to), and with none NoGoodCheckpoint ends the attempt."""
        why = ""
        try:
            if win.from_checkpoint and ref is not None:
                win = self._reloaded(win, state=state, checkpoints=checkpoints)
            elif win.from_checkpoint and self.fresh is not None:
                self.lent.numerics.applied.count = state.restore(self.fresh.state, "fp32", None)
            elif not state.finite():
                why = f"no checkpoint before step {win.first_fault} and non-finite weights in memory"
        except NoGoodCheckpoint:
            raise  # on every rank (agreed while the checkpoints were tried)
        except Exception as exc:  # e.g. fp32 needs more memory than there is: the precision stays blamed
            why = f"{type(exc).__name__}: {exc}"
        table = RankTable.agree({"failed": bool(why)}, self.lent.world, self.lent.numerics.precision.device)
        if not table.any("failed"):
            return win, None
        return win, why or f"rank(s) {listed(table.ranks('failed'))} could not load the replay's weights"

    def _reloaded(self, win: Window, *, state: TrainingState, checkpoints: Checkpointer) -> Window:
        """Load the last good checkpoint, or the good one before it, into `state` (a framework's:
        into its live weights, from the framework's checkpoint inside it): the window from it."""
        found: tuple[CheckpointRef, object] | None
        if (weights := self.weights if not state.objects else None) is not None:
            found = checkpoints.back_to(win.first_fault, lambda loaded: weights.load(loaded[0]))
        else:
            found = checkpoints.reload(state, win.first_fault, "fp32", None)
            if found is not None:  # the replay's steps count on from the checkpoint's, as training's did
                self.lent.numerics.applied.count = found[1]
        assert found is not None  # rank 0's last good checkpoint, at or before the first faulting step
        after = self.known.first_step if self.known is not None else -1
        return window(win.first_fault, checkpoint_step=found[0].step, replay_steps=self.spec.replay_steps, after=after)

    def _judge(self, win: Window) -> Replay:
        """Each step of the window in turn, until one is non-finite on any rank (all ranks stop
        at the same step: the flags are agreed after every step)."""
        world, device, tally = self.lent.world, self.lent.numerics.precision.device, self.lent.numerics.tally
        began = time.monotonic()
        for index in (i for i in win.steps if not self.skipped(i)):  # one skipped whole trains nothing, as in training
            raised = False
            self.lent.numerics.guard.begin_step()  # each replayed step's update counts once, as end_step counts
            try:
                self.step(index)
            except Exception as exc:  # this rank's error; the others learn of it below
                why = f"replayed step {index} raised {type(exc).__name__}: {exc}"
                self.lent.log("replaySkipped", why=why, all_ranks=True)
                raised = True
            mine = {
                "loss": not finite(tally.loss_sum),
                "grad": not finite(tally.grad_norm),
                "raised": raised,
                "late": time.monotonic() - began > self.spec.replay_timeout_seconds,
            }
            tally.clear()
            table = RankTable.agree(mine, world, device)
            done = index - win.steps.start + 1
            if table.any("raised"):
                return verdict_of("inconclusive", win, began, steps=done)
            if table.any("loss", "grad"):
                self.offending = self.named.offending(index, table.ranks("loss") or table.ranks("grad"))
                return verdict_of("data", win, began, steps=done, offending=self.offending)
            if table.any("late") and index != win.steps[-1]:
                return verdict_of("inconclusive", win, began, steps=done)
        return verdict_of("precision", win, began, steps=len(win.steps))

    def samples_named(self, index: int, cause: SkipCause, screen: ScreenFunction | None) -> list[int]:
        """The samples of step `index` to quarantine (StepSamples.to_quarantine): for bad data, as
        this replay's verdict named them."""
        return self.named.to_quarantine(index, cause, screen, self.offending)
