"""Session: one process's share of an attempt, as a training loop sees it.

The loop keeps its own model, optimizer, schedule and data; the session owns what mpjob
promises about every attempt: the precision (autocast, GradScaler, keepFp32), the numeric
guard, checkpoints and exact resume, progress metrics, preemption, and the exit code and
termination report. Per optimizer step it never waits for the device beyond GradScaler's
own found_inf check: losses, the gradient norm and the guard's counters stay device tensors
until `end_step` reaches a log or checkpoint interval, where one all-reduced read
(NumericGuard.read) serves the log line, the metrics, the guard and the checkpoint decision.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from mpjob_contract.api import MixedPrecisionJobSpec, Precision
from mpjob_contract.codes import ExitCode
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.report import Counters, Measurement, Replay
from mpjob_trainer import distributed as dist_env
from mpjob_trainer import speed
from mpjob_trainer.checkpoint import CheckpointStore
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError, NumericFault, Preempted, Repromote
from mpjob_trainer.events import EventLog
from mpjob_trainer.guard import GuardReading, NumericGuard
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.precision import PrecisionPolicy, autocast_fp32_types, keep_fp32, resolve
from mpjob_trainer.session.attempt import config_digest
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.ending import Standing, classify, conclude
from mpjob_trainer.session.measure import agreed_seconds, candidates, choose, nothing_kept, time_steps
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.progress import Interval, Progress, host_value
from mpjob_trainer.session.quality import EvalFunction, QualityGate
from mpjob_trainer.session.replay import Fp32Replay, Replaying, SamplesFunction, StepFunction, ending_for, finite
from mpjob_trainer.session.state import TrainingState, seed_everything

Number = torch.Tensor | float


class Session:
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
        self._log = log
        self._preemption = preemption
        self.device = dist_env.pick_device(world)
        dist_env.init_process_group(world, self.device)
        seed_everything(self.spec.training.seed)
        self.precision: Precision = resolve(launch.precision, self.device)
        self._policy = PrecisionPolicy(self.precision, self.device, self.spec.precision)
        self._policy.configure_backend()
        self._scaler = self._policy.make_scaler()
        self._guard = NumericGuard(self.spec.precision.guard, self.device, world)
        self._metrics, self._checkpoints, self._progress = self._reporting(flops_per_sample, tokens_per_sample)
        self._state: TrainingState | None = None
        self._watched: set[int] = set()
        #: Optimizer steps actually applied (GradScaler skips overflowing ones); checkpointed.
        self.applied_steps = 0
        #: The loss at the last log or checkpoint interval.
        self.last_loss: float | None = None
        self.start_step = 0
        self._started_at: int | None = None  # the start step once resume() decided it (the report's)
        self._step = 0
        self._loss_scale: float | None = None
        self._loss_sum: torch.Tensor | None = None  # this step's losses passed to backward()
        self._reported: Number | None = None  # the loss the last step reported
        self._grad_norm: torch.Tensor | None = None
        self._lr: Number | None = None
        self._exit_code: int | None = None
        self._replay: Fp32Replay | None = None
        self._probing = False
        self._measurement: Measurement | None = None
        self._gate: QualityGate | None = None
        #: The last step of an interval with numeric trouble (re-promotion counts clean steps from it).
        self._trouble_at = 0
        self._replayed: Replay | None = None

    def _reporting(self, flops: float | None, tokens: int | None) -> tuple[TrainerMetrics, Checkpointer, Progress]:
        """The attempt's metrics (served from rank 0), checkpoints and progress lines."""
        launch = self.launch
        metrics = TrainerMetrics(launch.job_name, launch.namespace, launch.attempt, self.precision)
        if self.world.is_main:
            metrics.serve()
        digest = config_digest(launch)
        store = CheckpointStore(
            Path(launch.checkpoint_dir), self.spec.checkpoint.keep, digest, self._log, job=launch.job_identity
        )
        checkpoints = Checkpointer(store, self.world, self._log, metrics)
        progress = Progress(
            metrics, self._log, self.world, self.device, flops_per_sample=flops, tokens_per_sample=tokens
        )
        return metrics, checkpoints, progress

    # ---------------------------------------------------------------- what the run is
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

    # ---------------------------------------------------------------- set-up
    def keep_fp32(self, model: nn.Module) -> list[str]:
        """Run spec.precision.keepFp32 module types in fp32 under autocast; returns the names of
        the modules wrapped. Types autocast already runs in fp32 on this device are left alone."""
        if self.precision == "fp32":  # no autocast: they run in fp32 already, untouched
            return []
        kept = self.spec.precision.keep_fp32
        wrapped = keep_fp32(model, kept, self.device)
        free = autocast_fp32_types(self.device)
        self._log("keepFp32", wrapped=wrapped, skipped=[name for name in kept if name in free])
        return wrapped

    def compile(self, model: nn.Module) -> nn.Module:
        """`torch.compile(model)` as spec.training.compile says (auto: on CUDA), else `model`.
        Call it after keep_fp32 and before wrap; resume() takes the uncompiled module."""
        compiled = speed.compile_model(model, self.spec.training.compile, self.device)
        self._log("compile", mode=self.spec.training.compile, compiled=compiled is not model)
        return compiled

    def adamw(
        self, model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95)
    ) -> torch.optim.AdamW:
        """AdamW with no weight decay on parameters of fewer than 2 dimensions, fused on CUDA."""
        return speed.adamw(model, lr=lr, weight_decay=weight_decay, betas=betas)

    def wrap(self, model: nn.Module) -> nn.Module:
        """DistributedDataParallel when the attempt has several processes, else the model."""
        if not self.world.distributed:
            return model
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The attempt's autocast for forward passes (a no-op in fp32)."""
        return self._policy.autocast()

    def resume(self, **stateful: Any) -> int:
        """Register what checkpoints hold, load the attempt's checkpoint into it; the start step."""
        if self._state is not None:
            raise ConfigError("resume() was called twice: call it once, before the first step")
        self._state = TrainingState(stateful)
        for optimizer in self._state.optimizers():
            self._watch(optimizer)
        store = self._checkpoints.store
        if self.world.is_main:
            store.clean_stale()
        dist_env.barrier(self.world)
        loaded = store.load(self.launch.resume_from, newer_in=self.precision)
        if loaded is None:
            self._log("freshStart", reason=f"no valid checkpoint in {store.root}: starting at step 0")
        else:
            ref, state = loaded
            self.applied_steps = self._state.restore(state, self.precision, self._scaler)
            self.start_step = self._step = ref.step
            self._log("resume", step=ref.step, path=ref.path, sha256=ref.sha256, fromPrecision=ref.precision)
        self._guard.start_at(self.start_step)
        self._trouble_at = self._started_at = self.start_step
        self._progress.started(self.launch, self.precision, self.start_step, store.last_good)
        return self.start_step

    def register_step(self, step: StepFunction, *, samples: SamplesFunction | None = None) -> None:
        """The loop's step as a function of its index, for the session to run it itself: `step(i)`
        runs optimizer step i (0-based) as the loop does (forward and backward under
        run.autocast(), run.backward, run.step; not end_step), `samples(i)` names its samples.
        With it an `auto` attempt measures its precision now (session.measure) and a numeric
        fault is replayed in fp32 (session.replay). Call it after resume()."""
        self._replay = Fp32Replay(step, samples, spec=self.spec.precision.guard)
        if self.launch.precision == "auto" and self._measurement is None and self._state is not None:
            self._measure(step)

    def evaluate_with(self, evaluate: EvalFunction) -> None:
        """The quality gate's evaluation (spec.validation; session.quality): `evaluate()` returns
        the mean eval loss of the current weights, computed under run.autocast()."""
        self._gate = QualityGate(evaluate, self.spec.validation, self.world, self.device)

    def _measure(self, step: StepFunction) -> None:
        """Time the step in each precision the device supports; train in the one chosen."""
        assert self._state is not None
        modules = [o for o in self._state.objects.values() if isinstance(o, nn.Module)]
        seconds: dict[str, float | None] = {}
        self._probing = True
        try:
            with nothing_kept(modules):
                for precision in candidates(self.device):
                    self._use(precision)
                    seconds[precision] = time_steps(lambda: self._probe(step), self.device)
        finally:
            self._probing = False
        measurement = choose(agreed_seconds(seconds, self.world, self.device))
        self._use(measurement.chosen)
        self._metrics.relabel(measurement.chosen)
        self._metrics.measured_steps(measurement.step_seconds)
        self._measurement = measurement
        self._log("precisionMeasured", **measurement.model_dump(by_alias=True))

    def _probe(self, step: StepFunction) -> bool:
        self._loss_sum = None
        step(self.start_step)
        finite_loss = finite(self._loss_sum)
        self._loss_sum = None
        return finite_loss

    def _use(self, precision: str) -> None:
        """Train (or replay, or probe) in `precision` from here on."""
        self.precision = cast(Precision, precision)
        self._policy = PrecisionPolicy(self.precision, self.device, self.spec.precision)
        self._policy.configure_backend()
        self._scaler, self._loss_sum = self._policy.make_scaler(), None

    def _watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hook the optimizer so the guard knows which steps GradScaler applied (no sync)."""
        if id(optimizer) not in self._watched:
            self._watched.add(id(optimizer))
            optimizer.register_step_post_hook(self._optimizer_stepped)

    def _optimizer_stepped(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        if self._guard.optimizer_stepped(optimizer):
            self.applied_steps += 1

    # ---------------------------------------------------------------- one step
    def backward(self, loss: torch.Tensor) -> None:
        """Backward through the (fp16: scaled) loss; the loss is kept on the device for the guard."""
        (self._scaler.scale(loss) if self._scaler is not None else loss).backward()
        detached = loss.detach().float()
        self._loss_sum = detached if self._loss_sum is None else self._loss_sum + detached

    def step(self, optimizer: torch.optim.Optimizer, *, clip_norm: float | None = None) -> None:
        """Clip the true (unscaled) gradients, step unless they overflowed, zero them."""
        if self._probing:  # measuring precisions: nothing is applied
            optimizer.zero_grad(set_to_none=True)
            return
        self._watch(optimizer)
        self._lr = optimizer.param_groups[0]["lr"]
        params = [p for group in optimizer.param_groups for p in group["params"]]
        scaler = self._scaler
        if scaler is not None:
            scaler.unscale_(optimizer)  # clipping sees true gradients
        self._grad_norm = torch.nn.utils.clip_grad_norm_(params, clip_norm or math.inf)
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def end_step(self, step: int, *, loss: Number | None = None, samples: int | None = None) -> None:
        """Close optimizer step `step` (1-based); at intervals: report, guard, checkpoint, preempt."""
        if self._state is None:
            raise ConfigError("call run.resume(...) before the first end_step(): it names what checkpoints hold")
        self._close_step(step, loss, samples)
        at_log = step % self.spec.training.log_every == 0 or step == self.total_steps
        at_ckpt = step % self.spec.checkpoint.every_steps == 0 or step == self.total_steps
        at_eval = self._gate is not None and self._gate.due(step)
        stop = self._preemption.raised and not self.world.distributed  # alone: no need to agree
        if at_log or at_ckpt or stop or at_eval:
            self._interval(step, at_log=at_log, at_ckpt=at_ckpt, at_eval=at_eval)

    def _close_step(self, step: int, loss: Number | None, samples: int | None) -> None:
        """Per-step guard bookkeeping, host-only (raises on too many overflows in a row)."""
        self._step = step
        reported = self._loss_sum if loss is None else loss
        self._reported = reported.detach() if isinstance(reported, torch.Tensor) else reported
        observed = self._loss_sum if self._loss_sum is not None else self._reported
        if observed is not None:
            self._guard.observe_loss(torch.as_tensor(observed))
        self._progress.window.add(samples)
        try:
            self._guard.end_step(step, self._scaler is not None)
        finally:
            self._guard.begin_step()
            self._loss_sum = None

    def _interval(self, step: int, *, at_log: bool, at_ckpt: bool, at_eval: bool = False) -> None:
        """The one sync point of an interval: read, report, judge, checkpoint, stop."""
        scale = getattr(self._scaler, "_scale", None) if self._scaler is not None else None
        reading = self._guard.read(scale, flag=1.0 if self._preemption.raised else 0.0)
        loss, grad_norm = host_value(self._reported), host_value(self._grad_norm)
        self.last_loss, self._loss_scale = loss, reading.loss_scale
        if self.world.is_main:
            self._checkpoints.collect(block=False, training_step=step)
        if at_log:
            self._progress.report(self._numbers(step, reading, loss, grad_norm))
        self._guard.check(step, reading, loss, grad_norm)
        if at_eval:
            self._evaluate(step)
        if not self._guard.healthy(loss):
            self._trouble_at = step
        stop = reading.flag > 0
        promote = at_ckpt and self._repromote_due(step)
        if at_ckpt or stop:
            saved = self._checkpoint(step, loss, final=step == self.total_steps or stop or promote)
            if promote and saved:
                clean = step - self._trouble_at
                self._log("repromote", step=step, cleanSteps=clean)
                raise Repromote(f"{clean} clean steps in {self.precision}; checkpoint at step {step} written")
        if stop:
            self._log("preempted", step=step)
            raise Preempted(f"SIGTERM honoured at step {step}; checkpoint written")

    def _evaluate(self, step: int) -> None:
        """The quality gate at `step`: eval in this precision and in fp32, record, judge."""
        assert self._gate is not None
        evaluation = self._gate.measure(step, in_fp32=self._in_fp32, low=self.precision != "fp32")
        self._metrics.evaluated(evaluation.loss, evaluation.loss_fp32, evaluation.delta, evaluation.seconds)
        self._log(
            "eval",
            step=step,
            loss=evaluation.loss,
            lossFp32=evaluation.loss_fp32,
            delta=evaluation.delta,
            seconds=round(evaluation.seconds, 4),
        )
        self._gate.judge(evaluation)

    def _in_fp32(self, run: Callable[[], float]) -> float:
        """`run()` with autocast off (the weights are fp32 masters already)."""
        policy, self._policy = self._policy, PrecisionPolicy("fp32", self.device, self.spec.precision)
        try:
            return run()
        finally:
            self._policy = policy

    def _repromote_due(self, step: int) -> bool:
        """Has this fallback attempt had launch.repromoteAfterSteps clean steps (not at the end)?"""
        after = self.launch.repromote_after_steps
        return after is not None and step < self.total_steps and step - self._trouble_at >= after

    def _numbers(self, step: int, reading: GuardReading, loss: float | None, grad_norm: float | None) -> Interval:
        return Interval(
            step=step,
            precision=self.precision,
            loss=loss,
            loss_scale=reading.loss_scale,
            grad_norm=grad_norm,
            lr=host_value(self._lr),
            overflow_steps=self._guard.overflow_steps,
            non_finite_losses=reading.non_finite_losses,
            applied_steps=self.applied_steps,
        )

    def _checkpoint(self, step: int, loss: float | None, *, final: bool) -> bool:
        """Save the state at `step`, unless this interval saw numeric trouble (never a bad one)."""
        state = self._state
        assert state is not None
        if not (self._guard.healthy(loss) and state.finite()):
            self._log("checkpointSkipped", step=step, why="numeric trouble in this window")
            return False

        def capture() -> dict[str, Any]:
            return state.capture(step, self.applied_steps, self.precision, self._scaler)

        self._checkpoints.save(step, self.precision, capture, final=final)
        self._guard.mark_good()
        return True

    # ---------------------------------------------------------------- the ending
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
        if self.world.is_main:
            with contextlib.suppress(Exception):
                self._checkpoints.collect(block=True, training_step=self._step)
        if isinstance(exc, NumericFault):
            exc = self._judge(exc)
        self._exit_code = conclude(exc, self._standing(), self._log)
        with contextlib.suppress(Exception):
            dist_env.shutdown(self.world)
        self._preemption.restore()
        return self._exit_code

    def _judge(self, fault: NumericFault) -> Exception:
        """Replay the fault in fp32 when the loop allows it: the data's fault, or the precision's."""
        if self._replay is None or self._state is None or self.precision == "fp32":
            return fault
        where = Replaying(self._guard, self._checkpoints, self._state, self.world, self.device, self._log)
        trained_in, check = self.precision, self._replay_step_finite
        try:
            replay = self._replay.run(fault, where, enter_fp32=lambda: self._use("fp32"), check=check)
        finally:
            self.precision = trained_in  # the attempt's precision, for its report (the replay's is fp32)
        if replay is None:
            return fault
        self._replayed = replay
        self._metrics.replayed(replay.verdict, replay.seconds)
        return ending_for(fault, replay)

    def _replay_step_finite(self) -> bool:
        ok = finite(self._loss_sum) and finite(self._grad_norm)
        self._loss_sum = None
        return ok

    def _standing(self) -> Standing:
        guard, loss = self._guard, self.last_loss
        counters = Counters(
            overflow_steps=guard.overflow_steps,
            non_finite_losses=guard.non_finite_losses,
            loss_scale=self._loss_scale,
            loss=loss if loss is not None and math.isfinite(loss) else None,
        )
        return Standing(
            self._step,
            self._started_at,
            self.precision,
            self._checkpoints.last_good,
            counters,
            self._replayed,
            self._measurement,
        )
