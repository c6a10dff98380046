"""Cadence and IntervalWork: which steps are intervals, and what an interval does.

Between intervals `end_step` is host-only bookkeeping. An interval is a step where the
session reads the device once (session.steps) because something needs the numbers: a log
line (every training.logEvery steps and the last), a checkpoint (every
checkpoint.everySteps steps and the last; the last is the one the loop stopped early after, if
it did: session.early_stop), a quality-gate evaluation (every
validation.everySteps steps) or, for a process alone, SIGTERM (under DDP the flag is
all-reduced at the next interval instead, so every rank stops at the same step).

Re-promotion (launch.repromoteAfterSteps, fallback attempts only) counts clean steps since
the last interval that saw numeric trouble; it is decided at checkpoint steps before the
last that SIGTERM does not stop at, because it ends the attempt with a checkpoint to resume the
faster precision from. Checkpoints carry that step (session.clean_steps).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.faults import GuardRule
from mpjob_contract.report import Counters
from mpjob_contract.timeline import ScaleHistory
from mpjob_trainer.checkpoint import CheckpointTaken
from mpjob_trainer.errors import ConfigError, NumericFault, Preempted, Repromote
from mpjob_trainer.events import EventLog
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.clean_steps import LastTrouble
from mpjob_trainer.session.early_stop import STOPPED_EARLY, EarlyStop, whole_step
from mpjob_trainer.session.progress import Progress
from mpjob_trainer.session.quality import QualityGate
from mpjob_trainer.session.state import LAST_TROUBLE, TrainingState
from mpjob_trainer.session.steps import Read, StepNumerics

Gate = QualityGate | None


@dataclass(frozen=True)
class Due:
    """What an interval at a step has to do."""

    log: bool
    checkpoint: bool
    evaluate: bool
    stop: bool

    @property
    def any(self) -> bool:
        return self.log or self.checkpoint or self.evaluate or self.stop


class Cadence:
    def __init__(
        self, spec: MixedPrecisionJobSpec, repromote_after: int | None, *, training_in: Callable[[], str]
    ) -> None:
        self.spec = spec
        self.repromote_after = repromote_after
        #: The last step of an interval with numeric trouble (re-promotion counts clean steps from it).
        self.trouble_at = LastTrouble(training_in)
        #: Attempts begun in place in these processes (session.inplace): the quality gate's streak is one attempt's.
        self.begun = 0
        #: Where the loop stopped early, if it did (session.early_stop); checkpointed.
        self.early = EarlyStop()
        #: A framework numbers the steps (FrameworkRun): Lightning's global step counts every
        #: optimizer's step, 2 a batch for a module stepping 2; a loop's own count up by one.
        self.framework_numbered = False

    @property
    def total(self) -> int:
        return self.spec.training.steps

    def last(self, step: int) -> bool:
        """Is `step` the run's last: spec.training.steps, or the step the loop stopped early after?"""
        return step == self.total or self.early.at(step)

    def due(self, step: int, *, evaluate: bool, stop_alone: bool) -> Due:
        """What step `step` (1-based) calls for; `evaluate`: the quality gate's due, `stop_alone`:
        SIGTERM seen by a process that needs no other rank's agreement."""
        last = self.last(step)
        return Due(
            log=step % self.spec.training.log_every == 0 or last,
            checkpoint=step % self.spec.checkpoint.every_steps == 0 or last,
            evaluate=evaluate,
            stop=stop_alone,
        )

    def interval(self, step: int) -> int:
        """The steps of the checkpoint interval that ends at `step` (1-based): since the last multiple
        of checkpoint.everySteps before it."""
        every = self.spec.checkpoint.every_steps
        return step - (step - 1) // every * every

    def follows(self, last: int, step: int, *, reentering: bool = False) -> None:
        """May the loop close step `step` after step `last` (resume's start step at first): the next one
        (a framework's: any above it)? Else the checkpoints would hold weights under another step's
        number (a micro-batch count's), and the last one never. A loop `reentering` goes on from a
        checkpoint's step: only the number's kind is checked then."""
        whole_step("end_step", step)
        follows = step == last + 1 or (self.framework_numbered and step > last)
        if not reentering and not (follows and step <= self.total):
            raise ConfigError(
                f"end_step({step}): optimizer steps are numbered from 1 to spec.training.steps={self.total} and "
                f"each is closed once, counting up by one: after step {last} the next is {last + 1}"
            )

    def trouble(self, step: int) -> None:
        """The interval ending at `step` saw numeric trouble (or the attempt starts there)."""
        self.trouble_at.step = step

    def stateful(self) -> dict[str, Any]:
        """What checkpoints hold of the cadence (TrainingState's reserved keys): the early stop, the last trouble."""
        return {STOPPED_EARLY: self.early, LAST_TROUBLE: self.trouble_at}

    def begin(self, step: int, *, faulted_at: int | None = None) -> None:
        """An attempt begins in place at `step` (a fallback's after a fault at `faulted_at`): its quality
        gate counts from there, its clean steps as a restarted one's (LastTrouble.resumed)."""
        self.trouble_at.resumed(step, faulted_at=faulted_at)
        self.begun += 1

    def clean_steps(self, step: int) -> int:
        return step - self.trouble_at.step

    def repromote_due(self, step: int) -> bool:
        """Has this fallback attempt had repromoteAfterSteps clean steps (not at the end)?"""
        after = self.repromote_after
        return after is not None and not self.last(step) and self.clean_steps(step) >= after


class IntervalWork:
    """What `end_step` does at an interval, from its one sync point on: report, check,
    evaluate, checkpoint a healthy state, re-promote, stop. The loop's parts (its state, the
    quality gate) and the checkpointer (a framework may replace it) are passed per call."""

    def __init__(self, numerics: StepNumerics, cadence: Cadence, *, progress: Progress, log: EventLog) -> None:
        self.numerics = numerics
        self.cadence = cadence
        self.progress = progress
        self.log = log
        #: Called with each interval's numbers right after its read, before its log line and checks
        #: (the data rung's, session.skipping): a fault they return ends the interval there.
        self.inspectors: list[Callable[[int, Read], NumericFault | None]] = []
        #: The loss and loss scale read at the last interval.
        self.last_loss: float | None = None
        self.loss_scale: float | None = None
        #: The attempt's loss-scale history for its report (a point per checkpoint and big change).
        self.scales = ScaleHistory()

    def run(
        self, step: int, due: Due, *, flag: float, state: TrainingState, checkpoints: Checkpointer, gate: Gate
    ) -> Exception | None:
        """The interval's work; what ends the step, if anything: a NumericFault (a rung may
        recover from it), Repromote or Preempted (raised only at the SDK's edge, Session.end_step)."""
        numerics, guard = self.numerics, self.numerics.guard
        read = numerics.read(flag)
        loss, reading = read.loss, read.guard
        self.last_loss, self.loss_scale = loss, reading.loss_scale
        if checkpoints.world.is_main:
            checkpoints.collect(block=False, training_step=step)
        for inspect in self.inspectors:  # before the log line: a rollback logs the step once, after it
            if (seen := inspect(step, read)) is not None:
                return seen
        if due.log:
            self.progress.report(numerics.numbers(step, read))
        self.scales.seen(step, reading.loss_scale, checkpoint=due.checkpoint)  # before a fault ends the attempt
        fault = guard.check(step, reading, loss, read.grad_norm)
        if fault is None and due.evaluate and gate is not None:
            metrics, attempt = self.progress.metrics, self.cadence.begun
            fault = gate.check(step, precision=numerics.precision, metrics=metrics, log=self.log, attempt=attempt)
        if fault is not None:
            return fault
        return self._end_interval(step, due, reading.flag > 0, state=state, checkpoints=checkpoints)

    def _end_interval(
        self, step: int, due: Due, stop: bool, *, state: TrainingState, checkpoints: Checkpointer
    ) -> Exception | None:
        """A healthy interval's end: checkpoint, then Repromote or Preempted when due (neither at the
        last step: its checkpoint is the run's final one, and no later attempt has a step to train).
        A stop outranks a re-promotion due at the same step: one made in place (session.skipping)
        would train on past it, toward the kill at the end of the pod's grace period."""
        numerics, guard = self.numerics, self.numerics.guard
        if not guard.healthy():
            self.cadence.trouble(step)
        promote = due.checkpoint and not stop and self.cadence.repromote_due(step)
        if not (due.checkpoint or stop):
            checkpoints.reserve(lambda: self._capture(step, state))  # the first save's buffers, ahead
        if due.checkpoint or stop:
            ended = self._idle(step, due) or self._poisoned(step, state=state, checkpoints=checkpoints)
            if ended is not None:  # trained nothing, or poisoned: nothing of it is saved
                return ended
            final = self.cadence.last(step) or stop or promote
            saved = self._checkpoint(step, state=state, checkpoints=checkpoints, final=final)
            if promote and saved:
                clean = self.cadence.clean_steps(step)
                self.log("repromote", step=step, cleanSteps=clean)
                return Repromote(
                    f"{clean} clean steps in {numerics.precision.precision}; checkpoint at step {step} written"
                )
        if stop and not self.cadence.last(step):  # at the last step nothing is left: the run ends Succeeded
            self.log("preempted", step=step)
            kept = "checkpoint written" if saved else "no checkpoint written (numeric trouble in this window)"
            return Preempted(f"SIGTERM honoured at step {step}; {kept}")
        return None

    def account(self) -> dict[str, Any]:
        """What the report says of the attempt's intervals (ending.Standing's fields)."""
        return {"counters": self.counters(), "loss_scales": self.scales.points}

    def counters(self) -> Counters:
        """The report's counters: the guard's, and what the last interval read."""
        guard, loss = self.numerics.guard, self.last_loss
        return Counters(
            overflow_steps=guard.overflow_steps,
            non_finite_losses=guard.non_finite_losses,
            loss_scale=self.loss_scale,
            loss=loss if loss is not None and math.isfinite(loss) else None,
        )

    def _capture(self, step: int, state: TrainingState) -> dict[str, Any]:
        precision = self.numerics.precision
        return state.capture(step, self.numerics.applied.count, precision.precision, precision.scaler)

    def _keeps(self, step: int) -> bool:
        """May the state at `step` be saved, if finite? Not after an interval that saw numeric trouble,
        but always at the last step: the run ends on it (overflow-skipped steps left it as it was)."""
        return self.numerics.guard.healthy() or self.cadence.last(step)

    def _idle(self, step: int, due: Due) -> Exception | None:
        """What ends a checkpoint step whose interval trained nothing (session.updates), if so: its
        checkpoint would count steps no update was applied in."""
        if not due.checkpoint:
            return None
        last, steps = self.cadence.last(step), self.cadence.interval(step)
        return self.numerics.updates.idle_fault(step, steps, last=last)

    def _poisoned(self, step: int, *, state: TrainingState, checkpoints: Checkpointer) -> NumericFault | None:
        """The fault that ends the precision at a save whose weights or buffers are non-finite
        (Checkpointer.finite, a collective: every rank asks): nothing of the state can be saved as
        good and no later step heals it (NaN running statistics stay NaN), so training on from it
        would only train on poison to the last step. Checked at saves only: no sync per step."""
        if not self._keeps(step) or checkpoints.finite(state):
            return None
        self.log("checkpointSkipped", step=step, why="non-finite weights or buffers")
        return NumericFault(
            GuardRule.MAX_NON_FINITE_LOSSES,
            f"the weights or buffers are non-finite at step {step}, found at its checkpoint (one forward overflow "
            "leaves BatchNorm's running statistics NaN for good): nothing of it can be saved, and the precision "
            "ends here rather than train on from it",
        )

    def _checkpoint(self, step: int, *, state: TrainingState, checkpoints: Checkpointer, final: bool) -> bool:
        """Save the state at `step` (`_poisoned` found it finite), unless this interval saw
        numeric trouble (never a bad one)."""
        guard, precision = self.numerics.guard, self.numerics.precision
        if not self._keeps(step):
            self.log("checkpointSkipped", step=step, why="numeric trouble in this window")
            return False
        try:
            checkpoints.save(step, precision.precision, lambda: self._capture(step, state), final=final)
        except CheckpointTaken as taken:
            if self.cadence.last(step):  # every attempt would train back to it: retrying cannot help
                raise ConfigError(last_step_taken(step, taken.where)) from None
            raise  # a SIGTERM's (or re-promotion's) save: a later attempt stops at another step
        guard.mark_good()
        return True


def last_step_taken(step: int, where: object) -> str:
    """Why a job cannot end while another job's checkpoint holds the place of its last step."""
    return (
        f"the last step's checkpoint (step {step}) cannot be written: {where}, in this job's checkpoint folder, "
        "holds a checkpoint another job wrote (or one whose manifest cannot be read), which is never replaced; "
        f"every attempt would train to step {step} and end here again. Move it out of the folder (or give this "
        "job a checkpoint folder of its own), then run the job again"
    )
