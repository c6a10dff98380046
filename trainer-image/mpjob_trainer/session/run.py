"""Session: one process's share of an attempt, as a training loop sees it.

The loop keeps its own model, optimizer, schedule and data; the session owns what mpjob promises
about every attempt, each through one collaborator: the precision and its modes (session.modes),
the step's arithmetic and the guard (session.steps), the intervals (session.interval), checkpoints
and exact resume (Checkpointer, TrainingState), progress, preemption, and the exit code and report (session.ending).

| phase    | entered by                  | the loop may call                                          |
|----------|-----------------------------|------------------------------------------------------------|
| OPEN     | `start()`                   | the set-up helpers (`keep_fp32`, `compile`, `wrap`, ...), `resume` |
| TRAINING | `resume()`                  | `register_step`, `evaluate_with`, `backward`, `step`, `end_step` |
| CLOSED   | `close()` / leaving `with`  | nothing: `close()` again returns the same exit code        |

`end_step` before `resume` and a second `resume` are configuration errors. `register_step`
in an `auto` attempt runs the PROBE mode once, then trains in the chosen precision; a
numeric fault runs the REPLAY mode inside `close`; the quality gate runs EVAL at its steps.

The one sync point: per optimizer step the session never waits for the device beyond
GradScaler's own found_inf check. Losses, the gradient norm and the guard's counters stay
device tensors until `end_step` reaches a log, checkpoint or evaluation interval (or a
single process sees SIGTERM); there one read (NumericGuard.read, all-reduced under DDP)
serves the log line, the metrics, the guard, the checkpoint decision and preemption.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from mpjob_contract.api import MixedPrecisionJobSpec, Precision
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import Measurement
from mpjob_trainer import distributed as dist_env
from mpjob_trainer import sharding
from mpjob_trainer.checkpoint.select import open_store
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError, NumericFault
from mpjob_trainer.events import EventLog
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.precision import resolve
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.attempt import config_digest
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.ending import Standing, classify, conclude
from mpjob_trainer.session.instruments import Instruments
from mpjob_trainer.session.interval import Cadence, IntervalWork
from mpjob_trainer.session.measure import measure_and_settle
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.progress import Progress
from mpjob_trainer.session.quality import EvalFunction, QualityGate
from mpjob_trainer.session.reentry import ReEntry
from mpjob_trainer.session.replay import Fp32Replay
from mpjob_trainer.session.rollback import FreshStart
from mpjob_trainer.session.setup import ModelSetUp
from mpjob_trainer.session.skipping import DataRung
from mpjob_trainer.session.state import TrainingState, seed_everything
from mpjob_trainer.session.steps import Number, SamplesFunction, StepFunction, StepNumerics


class Session(ModelSetUp, ReEntry):
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
        self.launch = launch
        #: The job's spec as this attempt trains it (its micro-batch split, see AttemptLaunch).
        self.spec: MixedPrecisionJobSpec = launch.attempt_spec()
        self.world = world
        self.preemption = preemption
        self._log = log
        self.device = dist_env.pick_device(world)
        dist_env.init_process_group(world, self.device)
        seed_everything(self.spec.training.seed)
        self._amp = AttemptPrecision(resolve(launch.precision, self.device), self.device, self.spec.precision)
        self._numerics = StepNumerics(self._amp, NumericGuard(self.spec.precision.guard, self.device, world))
        self._metrics = TrainerMetrics(launch.job_name, launch.namespace, launch.attempt, self.precision)
        self._instruments = Instruments(launch, world=world, device=self.device, log=log, metrics=self._metrics)
        store = open_store(launch, config_digest=config_digest(launch), log=log, metrics=self._metrics)
        self._checkpoints = Checkpointer(store, world, log, self._metrics)
        self._progress = Progress(self._metrics, log, world, self.device, flops_per_sample=None, tokens_per_sample=None)
        self.set_sample_cost(flops=flops_per_sample, tokens=tokens_per_sample)
        self._state: TrainingState | None = None
        self.start_step = 0
        self._started_at: int | None = None  # the start step once resume() decided it (the report's)
        self._step = 0
        self._exit_code: int | None = None
        self._replay: Fp32Replay | None = None
        self._measurement: Measurement | None = None
        self._gate: QualityGate | None = None
        self._wrapper = sharding.Wrapper(world, self.device, spec=self.spec, requested=launch.precision, log=log)
        self._context = AttemptContext(self._numerics, world, log, self._metrics)
        self._rung = DataRung(self.spec.precision.guard, self._context, self.spec.fault_policy)
        cadence = Cadence(self.spec, launch.repromote_after_steps)
        self._intervals = IntervalWork(self._numerics, cadence, progress=self._progress, log=log)
        self._intervals.inspectors.append(self._rung.inspect)

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

    @property
    def total_steps(self) -> int:
        return self.spec.training.steps

    def set_sample_cost(self, *, flops: float | None = None, tokens: int | None = None) -> None:
        """What one sample costs, for MFU and tokens/s, when start() could not be told (the
        builtin learns it from the task it loads inside the session)."""
        self._progress.flops_per_sample, self._progress.tokens_per_sample = flops, tokens

    # ---------------------------------------------------------------- set-up (session.setup: the model)
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The attempt's autocast for forward passes (a no-op in fp32)."""
        return self._amp.autocast()

    def resume(self, **stateful: Any) -> int:
        """Register what checkpoints hold, load the attempt's checkpoint into it; the start step."""
        if self._state is not None:
            raise ConfigError("resume() was called twice: call it once, before the first step")
        self._state = TrainingState(stateful, own=self._rung.stateful())
        opened = self._checkpoints.open(self._state, self.launch.resume_from, self.precision, self._amp.scaler)
        if opened is None:
            self._log("freshStart", reason=f"no valid checkpoint in {self._checkpoints.root}: starting at step 0")
        else:
            ref, self._numerics.applied.count = opened
            self.start_step = self._step = ref.step
            self._log("resume", step=ref.step, path=ref.path, sha256=ref.sha256, fromPrecision=ref.precision)
        for optimizer in self._state.optimizers():  # after loading: DCP may step an empty optimizer once
            self._numerics.applied.watch(optimizer)
        self._numerics.guard.start_at(self.start_step)
        self._intervals.cadence.trouble(self.start_step)
        self._started_at = self.start_step
        self._progress.started(self.launch, self.precision, self.start_step, self._checkpoints.last_good)
        return self.start_step

    def register_step(
        self, step: StepFunction, *, samples: SamplesFunction | None = None, modules: list[nn.Module] | None = None
    ) -> None:
        """The loop's step as a function of its index, for the session to run it itself: `step(i)` runs
        optimizer step i (0-based) as the loop does (under run.autocast(), run.backward, run.step; not
        end_step), `samples(i)` names its samples. With it an `auto` attempt measures its precision
        (session.measure) and a fault is replayed in fp32 (session.replay). Call it after resume().
        `modules`: the models whose buffers the measurement puts back (default: resume()'s)."""
        guard = self._wrapper.replayable(self.spec.precision.guard)
        first, needed = self._checkpoints.last_good is None, bool(guard.replay_steps) or self._rung.rolls_back
        fresh = FreshStart.if_needed(self._state, self._numerics, fresh=first, needed=needed)
        self._replay = Fp32Replay(step, samples, spec=guard, lent=self._context, fresh=fresh)
        self._rung.arm(self._replay, state=self._state, fresh=fresh)
        if self.launch.precision == "auto" and self._measurement is None and self._state is not None:
            if modules is None:
                modules = [o for o in self._state.objects.values() if isinstance(o, nn.Module)]
            self._measurement = measure_and_settle(step, self.start_step, modules=modules, at=self._context)

    def evaluate_with(self, evaluate: EvalFunction) -> None:
        """The quality gate's evaluation (spec.validation; session.quality): `evaluate()` returns
        the mean eval loss of the current weights, computed under run.autocast()."""
        self._gate = QualityGate(evaluate, self.spec.validation, self.world, self.device)

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The attempt's GradScaler (fp16; None otherwise), for a framework that scales and steps."""
        return self._amp.scaler

    @property
    def checkpoints(self) -> Checkpointer:
        """Who writes the attempt's checkpoints (the store, and how a save is reported)."""
        return self._checkpoints

    def checkpoint_with(self, checkpointer: Checkpointer) -> None:
        """Write checkpoints through `checkpointer` from now on (a framework adapter's own)."""
        self._checkpoints = checkpointer

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook an optimizer the session does not step itself (a framework's), as `resume` and
        `step` hook the loop's: the guard learns which steps GradScaler applied (no sync)."""
        self._numerics.applied.watch(optimizer)

    # ---------------------------------------------------------------- one step
    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the (fp16: scaled) loss; the loss is kept on the device for the guard."""
        self._numerics.backward(loss)

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
    ) -> None:
        """Close optimizer step `step` (1-based); at intervals: report, guard, checkpoint, preempt.
        `lr`, `grad_norm`: the learning rate and gradient norm (before clipping, unscaled) to report
        when the loop steps its optimizer itself (a framework); `step()` records them otherwise."""
        if self._state is None:
            raise ConfigError("call run.resume(...) before the first end_step(): it names what checkpoints hold")
        self._numerics.tally.stepped_elsewhere(lr=lr, grad_norm=grad_norm)
        self._step = step
        self._state.samples += samples or 0
        self._rung.step_samples = samples or self._rung.step_samples
        self._progress.window.add(samples)
        self._rung.closing(step, loss, close=self._close_step, state=self._state, checkpoints=self._checkpoints)

    def _close_step(self, step: int, loss: Number | None) -> None:
        assert self._state is not None  # end_step checked it
        self._numerics.close(step, loss, skipped=self.quarantined.skips_step(step - 1))
        self._instruments.step(step)
        gate, alone = self._gate, self.preemption.raised and not self.world.distributed  # alone: no need to agree
        due = self._intervals.cadence.due(step, evaluate=gate is not None and gate.due(step), stop_alone=alone)
        if due.any:
            flag = 1.0 if self.preemption.raised else 0.0
            self._intervals.run(step, due, flag=flag, state=self._state, checkpoints=self._checkpoints, gate=gate)

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
        if classify(exc, Standing()).code == ExitCode.SUCCESS:
            self._log("done", step=self._step, loss=self.last_loss, appliedSteps=self.applied_steps)
        elif isinstance(exc, NumericFault):
            self._metrics.trip(exc.rule)
            self._log("fault", step=self._step, rule=exc.rule, message=str(exc), all_ranks=True)
        self._checkpoints.settle(self._step)
        unjudged = self._replay is not None and self._replay.replayed is None  # else the data rung judged it
        if isinstance(exc, NumericFault) and self._replay is not None and self._state is not None and unjudged:
            exc = self._replay.judge(exc, state=self._state, checkpoints=self._checkpoints)  # data or precision?
        self._exit_code = conclude(exc, self._standing(), self._log)
        self._instruments.close(self._step, self._exit_code)
        with contextlib.suppress(Exception):
            dist_env.shutdown(self.world)
        self.preemption.restore()
        return self._exit_code

    def _standing(self) -> Standing:
        return Standing(
            step=self._step,
            start_step=self._started_at,
            precision=self.precision,
            last_good=self._checkpoints.last_good,
            counters=self._intervals.counters(),
            replay=self._replay.replayed if self._replay is not None else None,
            measurement=self._measurement,
            loss_scales=self._intervals.scales.points,
            skipped=self._rung.skipped(),
        )
