"""Session: one process's share of an attempt, as a training loop sees it: a facade over the
attempt's parts (session.assembly), each of which keeps one promise mpjob makes about every
attempt (precision and modes, step arithmetic and guard, intervals, checkpoints, recovery, report).

| phase    | entered by                  | the loop may call                                          |
|----------|-----------------------------|------------------------------------------------------------|
| OPEN     | `start()`                   | the set-up helpers (`keep_fp32`, `compile`, `wrap`, ...), `resume` |
| TRAINING | `resume()`                  | `register_step`, `run_step`, `evaluate_with`, `backward`, `step`, `end_step`|
| (again)  | `reentering(loop)` runs it again | set-up helpers, `resume`: a sharded model wrapped anew (inplace) |
| CLOSED   | `close()` / leaving `with`  | nothing: `close()` again returns the same exit code        |

Config errors: `end_step`, `register_step`, `checkpoint_start` before `resume` or after `close` (report written),
a second `resume`, a step closed out of order. `register_step` in an `auto` attempt runs the PROBE mode
once, then trains in the chosen precision; a numeric fault runs the REPLAY mode inside `close`; the
quality gate runs EVAL at its steps; one sync point per interval, none per step (session.steps)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mpjob_contract.api import MixedPrecisionJobSpec, Precision
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import Measurement
from mpjob_trainer import distributed as dist_env
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.events import EventLog
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.assembly import assemble
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.early_stop import StopCalls
from mpjob_trainer.session.ending import Standing, after_close, announce, conclude
from mpjob_trainer.session.machine import Phase
from mpjob_trainer.session.measure import measure_and_settle
from mpjob_trainer.session.memory import Reshape
from mpjob_trainer.session.outcomes import Rewrap
from mpjob_trainer.session.own_autocast import check_forwards
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.quality import EvalFunction, QualityGate
from mpjob_trainer.session.replay import LiveWeights
from mpjob_trainer.session.setup import SetUpCalls
from mpjob_trainer.session.state import TrainingState, seed_everything
from mpjob_trainer.session.steps import Number, SamplesFunction, StepFunction, require_callables, step_samples


class Session(SetUpCalls, StopCalls):
    """Made by `mpjob_trainer.session.start()`; use it as a context manager."""

    def __init__(
        self,
        launch: AttemptLaunch,
        world: World,
        log: EventLog,
        preemption: PreemptionFlag,
        *,
        flops_per_sample: float | None = None,
        tokens_per_sample: int | None = None,
    ) -> None:
        self.launch, self.world, self.preemption, self._log = launch, world, preemption, log
        self.device, spec = dist_env.pick_device(world), launch.attempt_spec()
        dist_env.init_process_group(world, self.device)
        seed_everything(spec.training.seed)
        parts = assemble(launch, spec, world, log, self.device, preemption)
        self._amp, self._numerics, self._metrics = parts.amp, parts.numerics, parts.metrics
        self._progress, self._instruments, self._checkpoints = parts.progress, parts.instruments, parts.checkpoints
        self._setup, self._context, self._intervals = parts.setup, parts.context, parts.intervals
        self._recovery, self._rung, self._closer = parts.recovery, parts.recovery.rung, parts.closer
        self._cadence = parts.intervals.cadence  # the run's last step (total_steps, an early stop: StopCalls)
        self._progress.cost(flops_per_sample, tokens_per_sample, call="start")
        self._state: TrainingState | None = None
        self.start_step = self._step = 0
        self._started_at: int | None = None  # the start step once resume() decided it (the report's)
        self._exit_code: int | None = None
        self._measurement: Measurement | None = None
        self._gate: QualityGate | None = None

    @property
    def spec(self) -> MixedPrecisionJobSpec:
        """The job's spec as this attempt trains it (its micro-batch split: AttemptLaunch, session.memory)."""
        return self._recovery.memory.spec

    @property
    def precision(self) -> Precision:
        """What the attempt trains in (while the session probes or replays: that mode's)."""
        return self._amp.precision

    @property
    def last_loss(self) -> float | None:
        """The loss read at the last interval."""
        return self._intervals.last_loss

    @property
    def applied_steps(self) -> int:
        """Optimizer steps actually applied (GradScaler skips overflowing ones); checkpointed."""
        return self._numerics.applied.count

    @property
    def samples_seen(self) -> int:
        """The data position: samples all ranks consumed so far, kept exact across resumes."""
        return self._state.samples if self._state is not None else 0

    @property
    def quarantined(self) -> Quarantine:
        """Samples (or steps) never to train on again (mpjob_trainer.quarantine); checkpointed."""
        return self._rung.quarantine

    @property
    def args(self) -> dict[str, Any]:
        """spec.task.args: the job's settings for the script."""
        return dict(self.spec.task.args)

    def set_sample_cost(self, *, flops: float | None = None, tokens: int | None = None) -> None:
        """What one sample costs (MFU, tokens/s) when start() could not be told (the builtin: its task)."""
        self._progress.cost(flops, tokens, call="set_sample_cost")

    # ---------------------------------------------------------------- set-up (SetUpCalls: keep_fp32, wrap, ...)
    def reentering(self, loop: Callable[[], None]) -> None:
        """Run `loop()` (build, wrap, resume, train), again in this process when the session leaves it
        to wrap a sharded model anew in another precision (session.inplace): resume() loads its state."""
        self._recovery.loop_reenters = True
        while True:
            try:
                return loop()
            except Rewrap as left:
                self._state, self._gate = None, None  # the old model and optimizer go with the loop
                self._recovery.left_loop(left.target)

    def reenter_on_rollback(self) -> None:
        """The loop re-enters from a checkpoint after a rollback instead of being rolled back in place (Recovery)."""
        self._recovery.reenter_on_rollback()

    def checkpoint_start(self) -> None:
        """At a fresh start of a loop that re-enters, checkpoint step 0 of what resume() registered (call it after)."""
        self._recovery.checkpoint_start(self._training("checkpoint_start()"), self._step, self._checkpoints)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The attempt's autocast for forward passes (a no-op in fp32)."""
        return self._amp.autocast()

    def resume(self, **stateful: Any) -> int:
        """Register what checkpoints hold, load the attempt's checkpoint into it; the start step."""
        if self._state is not None:
            raise ConfigError("resume() was called twice: call it once, before the first step")
        self._state = TrainingState(stateful, own={**self._rung.stateful(), **self._cadence.stateful()})
        check_forwards(self._state.modules, self._amp)  # a script's own autocast is told, not kept
        if self._recovery.reentry is not None:  # the loop re-entered to wrap its model anew (`reentering`)
            self.start_step = self._step = self._recovery.reenter(self._state, self._checkpoints)
            return self.start_step
        ref = self._checkpoints.resume(self._state, self._numerics, self.launch.resume_from)
        self.start_step = self._step = ref.step if ref is not None else 0
        self._numerics.guard.start_at(self.start_step)
        self._cadence.trouble_at.resumed(self.start_step, faulted_at=self.launch.repromote_counts_from)
        self._started_at = self.start_step
        recovered = self._recovery.resumed(self.launch.recovering_since)
        self._progress.started(self.launch, self.precision, self.start_step, self._checkpoints.last_good, recovered)
        return self.start_step

    def register_step(
        self,
        step: StepFunction,
        *,
        samples: SamplesFunction | None = None,
        modules: list[nn.Module] | None = None,
        weights: LiveWeights | None = None,
        reshape: Reshape | None = None,
    ) -> None:
        """The loop's step as a function of its index, for the session to run it itself: `step(i)` runs
        optimizer step i (0-based) as the loop does (under run.autocast(), run.backward, run.step; not
        end_step), `samples(i)` names its samples. With it an `auto` attempt measures its precision first
        (session.measure; its changes in place follow it), and a fault is replayed in fp32 (session.replay).
        After resume(). `modules`: the models whose buffers the measurement puts back (default: resume()'s);
        `weights`: a framework's state (session.replay); `reshape(micro, accumulation)`: train in that split."""
        state, guard = self._training("register_step()"), self._setup.wrapper.replayable(self.spec.precision.guard)
        require_callables("register_step", step=step, samples=samples, reshape=reshape)
        if self.launch.precision == "auto" and self._measurement is None:
            held = modules if modules is not None else state.modules
            self._measurement = measure_and_settle(step, self.start_step, modules=held, at=self._context)
            self._recovery.measured(self.launch.changes_in(self._measurement.chosen))
        self._recovery.arm(step, samples, guard=guard, weights=weights, reshape=reshape,
                           state=state, checkpoints=self._checkpoints, close=self._close_step)  # fmt: skip

    def run_step(self, step: int) -> None:
        """Run the registered step `step` (0-based), out of device memory in place when allowed (session.memory)."""
        self._recovery.run_step(step, state=self._state, checkpoints=self._checkpoints)

    def evaluate_with(self, evaluate: EvalFunction) -> None:
        """The quality gate's evaluation (spec.validation; session.quality): `evaluate()` returns
        the mean eval loss of the current weights, computed under run.autocast()."""
        self._gate = QualityGate(evaluate, self.spec.validation, self.world, self.device)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """fp16's GradScaler (None in other precisions): for a framework that scales and steps itself."""
        return self._amp.scaler

    @property
    def checkpoints(self) -> Checkpointer:
        """Who writes the attempt's checkpoints: the store, and how a save is told."""
        return self._checkpoints

    def checkpoint_with(self, checkpointer: Checkpointer) -> None:
        """Write checkpoints through `checkpointer` from now on (a framework adapter's own)."""
        self._checkpoints = checkpointer

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook an optimizer the session does not step itself (a framework's), as `resume` and
        `step` hook the loop's: the guard learns which steps GradScaler applied (no sync)."""
        self._numerics.watch(optimizer)

    # ---------------------------------------------------------------- one step
    def backward(self, loss: torch.Tensor, *, samples: int | None = None) -> None:
        """Backward through the (fp16: scaled) loss, kept for the guard; the `samples` it covers weigh it."""
        self._numerics.backward(loss, samples)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """fp16: unscale its gradients now, for clipping of the loop's own before `step()` (else nothing)."""
        self._numerics.unscale(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *, clip_norm: float | None = None) -> None:
        """Clip the true (unscaled) gradients, step unless they overflowed, zero them."""
        self._numerics.step(optimizer, clip_norm)

    def end_step(
        self,
        step: int,
        *,
        loss: Number | None = None,
        samples: int | None = None,
        lr: float | None = None,
        grad_norm: Number | None = None,
        loss_samples: int | None = None,
    ) -> None:
        """Close optimizer step `step` (1-based, counting up); at intervals: report, guard, checkpoint, preempt.
        `lr`, `grad_norm` (before clipping, unscaled), `loss_samples` (this rank's samples `loss`
        covers): to report when the loop steps its optimizer and runs backward itself."""
        state = self._training(f"end_step({step})")
        self._intervals.cadence.follows(self._step, step, reentering=self._rung.machine.phase is Phase.REENTERING)
        self._numerics.tally.stepped_elsewhere(lr=lr, grad_norm=grad_norm, loss_samples=loss_samples)
        state.samples += step_samples(samples)
        self._rung.step_samples = samples or self._rung.step_samples
        rung, checkpoints = self._rung, self._checkpoints
        end = rung.closing(step, loss, samples, close=self._close_step, state=state, checkpoints=checkpoints)
        if end is not None:  # the SDK's edge: what ends the step leaves the loop as an exception
            raise end

    def _close_step(self, step: int, loss: Number | None, samples: int | None) -> Exception | None:
        """Close step `step` (the loop's, or one a catch-up runs again) on what the loop trains now."""
        assert self._state is not None  # end_step checked it
        self._step = step  # where the attempt stands: a catch-up that ends on the way ends it there, not further
        closer, checkpoints = self._closer, self._checkpoints
        return closer.close(step, loss, samples, state=self._state, checkpoints=checkpoints, gate=self._gate)

    def _training(self, call: str) -> TrainingState:  # what resume() registered, between resume() and close()
        if self._exit_code is not None:
            raise after_close(call, step=self._step)
        if self._state is None:
            raise ConfigError(f"call run.resume(...) before {call}: it names what the session trains and checkpoints")
        return self._state

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        code = self.close(exc)
        if code != ExitCode.SUCCESS:
            raise SystemExit(code)
        return True  # success, also when the script called sys.exit(0)

    def close(self, exc: BaseException | None = None) -> int:
        """End the run: events, the last checkpoint's result, the report; returns the exit code.
        Only the first call ends it (a framework callback may close before `__exit__` does)."""
        if self._exit_code is not None:
            return self._exit_code
        if isinstance(exc, NumericFault):
            self._metrics.trip(exc.rule)
        announce(exc, self._step, self.last_loss, self.applied_steps, log=self._log)
        self._checkpoints.settle(self._step)
        exc = self._recovery.judge(exc, state=self._state, checkpoints=self._checkpoints)  # data or precision?
        standing = Standing(
            step=self._step,
            precision=self.precision,
            last_good=self._checkpoints.last_good,
            stopped_early=self.stopped_early,
            total=self.total_steps,
            measurement=self._measurement,
            **self._intervals.account(),
            **self._recovery.account(self._started_at),
        )
        self._exit_code = conclude(exc, standing, self._log)
        self._instruments.close(self._step, self._exit_code)
        with contextlib.suppress(Exception):
            dist_env.shutdown(self.world)
        self.preemption.restore()
        return self._exit_code
