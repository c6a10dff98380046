"""How one attempt's parts are built and wired together (the Session's composition root): the
precision and its step arithmetic, metrics and instruments, the checkpointer over the job's
store, progress, the model's set-up, the recovery, the interval work and how a step is closed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import sharding
from mpjob_trainer.checkpoint.select import open_store
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.guard import NumericGuard
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.precision import resolve
from mpjob_trainer.session.attempt import config_digest
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.closing import StepCloser
from mpjob_trainer.session.context import AttemptContext
from mpjob_trainer.session.inplace import InPlace
from mpjob_trainer.session.instruments import Instruments
from mpjob_trainer.session.interval import Cadence, IntervalWork
from mpjob_trainer.session.modes import AttemptPrecision
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.progress import Progress
from mpjob_trainer.session.recovery import Recovery
from mpjob_trainer.session.setup import ModelSetUp
from mpjob_trainer.session.steps import StepNumerics


@dataclass(frozen=True)
class Parts:
    amp: AttemptPrecision
    numerics: StepNumerics
    metrics: TrainerMetrics
    instruments: Instruments
    checkpoints: Checkpointer
    progress: Progress
    setup: ModelSetUp
    context: AttemptContext
    recovery: Recovery
    intervals: IntervalWork
    closer: StepCloser


def assemble(
    launch: AttemptLaunch,
    spec: MixedPrecisionJobSpec,
    world: World,
    log: EventLog,
    device: torch.device,
    preemption: PreemptionFlag,
) -> Parts:
    """The attempt's parts, wired: the data rung inspects every interval's read; SIGTERM (`preemption`)
    stops the attempt at a step's close."""
    amp = AttemptPrecision(resolve(launch.precision, device), device, spec.precision)
    numerics = StepNumerics(amp, NumericGuard(spec.precision.guard, device, world))
    metrics = TrainerMetrics(launch.job_name, launch.namespace, launch.attempt, amp.precision)
    store = open_store(launch, config_digest=config_digest(launch), log=log, metrics=metrics)
    progress = Progress(metrics, log, world, device)
    wrapper = sharding.Wrapper(world, device, spec=spec, requested=launch.precision, log=log)
    context = AttemptContext(numerics, world, log, metrics)
    cadence = Cadence(spec, launch.repromote_after_steps, training_in=lambda: numerics.precision.precision)
    changes = launch.changes_in(launch.precision)  # an `auto` attempt's once it has measured (Recovery.measured)
    in_place = InPlace(changes, attempt=launch.attempt, policy=spec.fault_policy, context=context, cadence=cadence)
    recovery = Recovery(spec.precision.guard, context, spec.fault_policy, in_place, launch=launch)
    intervals = IntervalWork(numerics, cadence, progress=progress, log=log)
    intervals.inspectors.append(recovery.rung.inspect)
    instruments = Instruments(launch, world=world, device=device, log=log, metrics=metrics)
    closer = StepCloser(numerics, intervals, progress=progress, instruments=instruments,
                        quarantine=recovery.rung.quarantine, preemption=preemption, world=world)  # fmt: skip
    return Parts(
        amp=amp,
        numerics=numerics,
        metrics=metrics,
        instruments=instruments,
        checkpoints=Checkpointer(store, world, log, metrics),
        progress=progress,
        setup=ModelSetUp(spec, launch, amp, wrapper, log=log, device=device),
        context=context,
        recovery=recovery,
        intervals=intervals,
        closer=closer,
    )
