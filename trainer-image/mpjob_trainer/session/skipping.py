"""DataRung: bad data and loss spikes cost a rollback, not the run (guard.onBadData, guard.spike).

Today's ladder gives up a precision when the guard trips; the fp32 replay (session.replay)
first tells whether the precision is at fault. When it says the data is (the step is
non-finite in fp32 too), or a finite loss spikes (session.spike), this rung keeps the attempt
in its precision instead:

1. roll the state back to the last good checkpoint (from the store, or the copy of the state
   taken at a fresh start when no checkpoint exists yet);
2. quarantine the offending steps' samples (session.quarantine: all ranks' samples, narrowed to
   the ones non-finite alone when the loop gave a screen), or the steps when it names none;
3. run the steps from the checkpoint up to where the loop stands again, through the loop's
   registered step function (which leaves quarantined samples out), so the loop goes on at its
   own next step as if the skipped samples had never been in the data.

A loop that cannot be rolled back in place (a framework adapter: HF Trainer and Lightning keep
their model, optimizer, schedule and data to themselves) re-enters instead (`reenters`): step 1
and 2 as above (the session's own state, from the checkpoint's state.pt), then RolledBack
leaves the loop, and the adapter re-enters its framework from that checkpoint's framework
checkpoint, its batch stream as before, a quarantined step training on nothing (the
framework cannot name samples: the step is quarantined whole).

The result equals a straight run whose quarantine held those samples from the start: the
steps before the offending one never saw them, and a rollback restores weights, optimizer,
scaler, schedule and generators exactly. Bounded by guard.maxSkippedSteps; past it the attempt
ends NonFiniteInFp32, naming the steps.

Triggers, at an interval's one read (IntervalWork's inspectors): a non-finite loss below the
guard's bound (fp16's GradScaler would skip that step and go on, with the sample still in
the data) is "suspect" and replayed at once; the guard's own trips are replayed as before.
A suspect step that fp32 finds finite is the precision's: the state is rolled back and the
same steps run again (deterministic: nothing changes), and no further suspect is raised in
this attempt, so the guard's bounds rule as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mpjob_contract.api import Guard as GuardSpec
from mpjob_contract.report import CheckpointRef
from mpjob_contract.skipping import SkipCause, Skipped, describe_steps, ranges
from mpjob_trainer.distributed import World, is_dtensor
from mpjob_trainer.errors import NonFiniteInFp32, NumericFault
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.agreement import main_says
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.quarantine import REPORT_RANGES, REPORT_STEPS, Quarantine
from mpjob_trainer.session.replay import Fp32Replay
from mpjob_trainer.session.spike import SpikeDetector
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import Number, Read, StepNumerics


class SuspectSteps(NumericFault):
    """A non-finite loss below the guard's bound, replayed before it can do harm."""


class RolledBack(Exception):
    """The session was rolled back to the checkpoint `ref`: the loop re-enters from it (a
    framework adapter, DataRung.reenters). Not a NumericFault: no precision is given up."""

    def __init__(self, ref: CheckpointRef) -> None:
        super().__init__(f"rolled back to the checkpoint of step {ref.step}")
        self.ref = ref


class LossSpiked(NumericFault):
    """Finite losses above their window (guard.spike) at `steps`."""

    def __init__(self, steps: range, detected_at: int) -> None:
        super().__init__("LossSpike", f"loss spike at steps {steps.start}-{steps.stop - 1} (detected at {detected_at})")
        self.steps = steps


@dataclass(frozen=True)
class Lent:
    """What the rung works with, lent by the session."""

    numerics: StepNumerics
    world: World
    log: EventLog
    metrics: TrainerMetrics


class DataRung:
    def __init__(self, spec: GuardSpec, lent: Lent) -> None:
        self.spec = spec
        self.lent = lent
        self.quarantine = Quarantine()
        self.quarantine.watcher = self._show
        self.spike: SpikeDetector | None = None
        if spec.spike.action == "rollback":
            self.spike = SpikeDetector(spec.spike, lent.numerics.precision.device)
            lent.numerics.guard.spike = self.spike
        self.replay: Fp32Replay | None = None
        #: The loop re-enters from a checkpoint instead of being rolled back in place (a
        #: framework adapter; Session.reenter_on_rollback): a rollback ends in RolledBack.
        self.reenters = False
        self._initial: dict[str, Any] | None = None
        self._rolled_back_to: CheckpointRef | None = None
        self._precision_suspected = False
        #: Samples of one optimizer step (all ranks; Session.end_step's), what a step skipped
        #: whole counts in mpjob_trainer_skipped_samples_total and the quarantine's summary.
        self.step_samples = 0

    def stateful(self) -> dict[str, Any]:
        """What checkpoints hold of the rung (TrainingState's reserved keys)."""
        return {"quarantine": self.quarantine, **({"spike": self.spike} if self.spike is not None else {})}

    def arm(self, replay: Fp32Replay, *, state: TrainingState | None, fresh: bool) -> None:
        """The loop registered its step; at a fresh start keep a host copy of the state to roll back
        to (the one cost of the rung before the first checkpoint: the state once, on the host).

        A loop whose state the session does not hold is armed only when it re-enters from a
        checkpoint (`reenters`: the framework adapters); otherwise a data verdict ends the
        attempt as with onBadData fail, and a spike is logged only."""
        if state is None or not (state.objects or self.reenters):
            return
        self.replay = replay
        if state.objects and fresh and self.rolls_back and self._initial is None:
            numerics = self.lent.numerics
            precision, scaler = numerics.precision.precision, numerics.precision.scaler
            self._initial = _host_copy(state.capture(0, numerics.applied.count, precision, scaler, in_memory=True))

    def _show(self) -> None:
        """The quarantine on the metrics endpoint (the operator's live status.skipped)."""
        self.lent.metrics.quarantined(self.quarantine.summary(spans=REPORT_RANGES))

    @property
    def rolls_back(self) -> bool:
        """May this rung roll the state back (bad data skipped, or spikes rolled back)?"""
        return self.spec.on_bad_data == "skip" or self.spike is not None

    def skipped(self) -> Skipped | None:
        """The report's record of what was skipped (None: nothing)."""
        if not len(self.quarantine):
            return None
        return self.quarantine.summary(steps=REPORT_STEPS, spans=REPORT_RANGES)

    def closing(
        self,
        step: int,
        loss: Number | None,
        *,
        close: Callable[[int, Number | None], None],
        state: TrainingState | None,
        checkpoints: Checkpointer,
    ) -> None:
        """Close step `step` with `close` (the session's); a fault the rung handles is recovered
        from and the step closed again, now on the re-run step's own loss."""
        while True:
            try:
                close(step, loss)
                return
            except NumericFault as fault:
                if state is None:
                    raise
                self.recover(fault, step=step, state=state, checkpoints=checkpoints)
                loss = None

    # ---------------------------------------------------------------- at an interval's read
    def inspect(self, step: int, read: Read) -> None:
        """Raise what the rung handles: a spike, or a non-finite loss the guard would let pass."""
        spikes = read.guard.spikes
        if spikes is not None and self.spike is not None:
            self.lent.log("lossSpike", firstStep=spikes.start, lastStep=spikes.stop - 1, detectedAt=step)
            self.spike.forget_spikes()
            if self.replay is not None:  # no registered step: nothing to run again, seen only
                raise LossSpiked(spikes, step)
        guard = self.lent.numerics.guard
        counted = read.guard.non_finite_losses - guard.forgiven
        suspect = guard.new_non_finite > 0 and counted < guard.spec.max_non_finite_losses
        if suspect and self.replay is not None and self.spec.on_bad_data == "skip" and not self._precision_suspected:
            raise SuspectSteps("MaxNonFiniteLosses", f"a non-finite loss by step {step}")

    # ---------------------------------------------------------------- the rung
    def recover(self, fault: NumericFault, *, step: int, state: TrainingState, checkpoints: Checkpointer) -> None:
        """Roll back, skip and catch up to `step` (1-based, where the loop stands); raises the
        attempt's ending when the rung cannot go on."""
        if isinstance(fault, LossSpiked):
            return self._skip(list(fault.steps), "spike", step=step, state=state, checkpoints=checkpoints)
        if self.replay is None or self.spec.on_bad_data != "skip":
            raise fault
        ending = self.replay.judge(fault, state=state, checkpoints=checkpoints)
        verdict = self.replay.replayed
        if isinstance(ending, NonFiniteInFp32) and verdict is not None and verdict.offending_step is not None:
            self.replay.replayed = None
            return self._skip([verdict.offending_step], "data", step=step, state=state, checkpoints=checkpoints)
        if not isinstance(fault, SuspectSteps):
            raise ending
        self._precision_suspected = True  # the precision's: today's bounds decide from here
        self.replay.replayed = None
        self._rewind_and_catch_up(step, state=state, checkpoints=checkpoints)
        return None

    def _skip(
        self, steps: list[int], cause: SkipCause, *, step: int, state: TrainingState, checkpoints: Checkpointer
    ) -> None:
        already = self.quarantine.steps
        if cause == "data" and set(steps) & set(already):
            raise NonFiniteInFp32(
                f"step {describe_steps(steps[:1])} is non-finite in fp32 again after it was skipped: the loop does "
                "not leave quarantined samples out (run.quarantined, docs/sdk.md), so skipping cannot help"
            )
        if len(already) + len(steps) > self.spec.max_skipped_steps:
            shown = describe_steps([*already, *steps])
            raise NonFiniteInFp32(
                f"{cause} at step(s) {shown}: more than guard.maxSkippedSteps={self.spec.max_skipped_steps} "
                "steps to skip; the data or the model is at fault, not the precision"
            )
        forgiven = self.lent.numerics.guard.forgiven
        start = self._rewind(min(steps), state=state, checkpoints=checkpoints)
        self.lent.metrics.forgave(self.lent.numerics.guard.forgiven - forgiven)
        named = [self._samples_of(s, cause) for s in steps]  # screened at the restored weights
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
        self._go_on(start, step)

    def _samples_of(self, index: int, cause: SkipCause) -> list[int]:
        """The samples of step `index`: for bad data those of the ranks the fp32 replay named (all
        ranks' when it named none), narrowed by the loop's screen; for a spike all ranks'."""
        replay = self.replay
        offending = replay.offending if replay is not None and cause == "data" else None
        if offending is not None and offending.step == index and offending.samples:
            every = sorted(set(offending.samples))  # gathered by the replay, the same on every rank
        else:
            mine = replay.samples(index) if replay is not None and replay.samples is not None else []
            every = _gathered(mine, self.lent.world)
        if cause == "data" and self.quarantine.screen is not None and every:
            narrowed = self.quarantine.screen(every)
            return narrowed or every
        return every

    def _rewind_and_catch_up(self, step: int, *, state: TrainingState, checkpoints: Checkpointer) -> None:
        start = self._rewind(step - 1, state=state, checkpoints=checkpoints)
        self._go_on(start, step)

    def _go_on(self, start: int, step: int) -> None:
        """After a rollback to `start`: catch up to `step` in place, or leave the loop to re-enter."""
        if self.reenters:
            assert self._rolled_back_to is not None  # a loop that re-enters has no in-memory start state
            raise RolledBack(self._rolled_back_to)
        self._catch_up(start, step)

    def _rewind(self, before: int, *, state: TrainingState, checkpoints: Checkpointer) -> int:
        """Restore the newest good state at or before step index `before`; its step."""
        # A save still being written counts (the rollback point does not depend on the disk's
        # speed), and every rank takes rank 0's (only rank 0 collects asynchronous saves).
        checkpoints.collect(block=True, training_step=before + 1)
        numerics, ref = self.lent.numerics, main_says(checkpoints.last_good, self.lent.world)
        if ref is not None and ref.step <= before:
            saved, start = checkpoints.state_of(ref), ref.step
        elif self._initial is not None:
            saved, start = self._initial, int(self._initial["step"])
        else:
            raise NonFiniteInFp32(f"no good state before step {before} to roll back to (no checkpoint yet)")
        self._rolled_back_to = ref if ref is not None and ref.step == start else None
        seen = state.samples
        numerics.applied.count = state.restore(saved, numerics.precision.precision, numerics.precision.scaler)
        if not self.reenters:
            # The data position stays where the loop stands: the catch-up re-runs the same positions
            # (quarantined samples left out of them), and a later checkpoint must say so. A loop
            # that re-enters runs them again itself, counting from the checkpoint's position.
            state.samples = seen
        numerics.guard.rewind(start)
        numerics.guard.begin_step()  # the replay's optimizer steps are not the loop's
        numerics.tally.clear()
        if self.spike is not None:
            self.spike.forget_spikes()
        return start

    def _catch_up(self, start: int, step: int) -> None:
        """Run steps start..step-1 (0-based) again; the loop's end_step closes the last."""
        replay, numerics = self.replay, self.lent.numerics
        assert replay is not None
        for index in range(start, step):
            if not self.quarantine.skips_step(index):
                replay.step(index)
            if index + 1 < step:
                numerics.close(index + 1, None, skipped=self.quarantine.skips_step(index))


def _gathered(samples: list[int], world: World) -> list[int]:
    """Every rank's samples (the same list on all ranks)."""
    if not world.distributed:
        return list(samples)
    parts: list[Any] = [None] * world.size
    dist.all_gather_object(parts, list(samples))
    return sorted({int(i) for part in parts for i in part})


def _host_copy(value: Any) -> Any:
    """A copy of a captured state on the host (a rollback target that training does not change).
    A sharded model's shards are copied where they are: a DTensor's mesh names its device, and
    at a fresh start they are 1/N of the weights (its optimizer holds no state yet)."""
    if is_dtensor(value):
        return value.detach().clone()
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_host_copy(v) for v in value)
    return value
