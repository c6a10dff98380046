"""StepCloser: how an optimizer step is closed, the loop's own (Session.end_step) and each step a
catch-up runs again (session.catch_up) alike: its samples counted in the throughput window, the
guard's host bookkeeping, the instruments' step and, when due, the interval's work (session.interval:
the log line, the guard's checks, the quality gate, a checkpoint, a re-promotion, SIGTERM). One
rule for both: the steps run again are logged, counted, checked and checkpointed as the loop's are."""

from __future__ import annotations

from mpjob_trainer.distributed import World
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.instruments import Instruments
from mpjob_trainer.session.interval import Gate, IntervalWork
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.progress import Progress
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.session.steps import Number, StepNumerics


class StepCloser:
    def __init__(
        self,
        numerics: StepNumerics,
        intervals: IntervalWork,
        *,
        progress: Progress,
        instruments: Instruments,
        quarantine: Quarantine,
        preemption: PreemptionFlag,
        world: World,
    ) -> None:
        self.numerics, self.intervals, self.progress, self.instruments = numerics, intervals, progress, instruments
        self.quarantine, self.preemption, self.world = quarantine, preemption, world

    def close(
        self,
        step: int,
        loss: Number | None,
        samples: int | None,
        *,
        state: TrainingState,
        checkpoints: Checkpointer,
        gate: Gate,
    ) -> Exception | None:
        """Close step `step` (1-based), which trained on `samples` (all ranks'; None: not told, which
        leaves the window's samples/s unknown) with `loss` (None: what backward() was given): what
        ends it, if anything (a NumericFault, Repromote, Preempted; session.interval)."""
        self.progress.window.add(samples)
        fault = self.numerics.close(step, loss, skipped=self.quarantine.skips_step(step - 1))
        if fault is not None:
            return fault
        self.instruments.step(step)
        raised = self.preemption.raised
        alone = raised and not self.world.distributed  # a process alone stops without the others' agreement
        due = self.intervals.cadence.due(step, evaluate=gate is not None and gate.due(step), stop_alone=alone)
        if not due.any:
            return None
        flag = 1.0 if raised else 0.0
        return self.intervals.run(step, due, flag=flag, state=state, checkpoints=checkpoints, gate=gate)
