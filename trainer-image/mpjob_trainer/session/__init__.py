"""The mpjob trainer SDK: what your own training loop needs to run as a mpjob attempt.

    from mpjob_trainer import session as mpjob

    with mpjob.start() as run:
        ...build model, optimizer, schedule, data...
        start = run.resume(model=model, optimizer=opt, scheduler=sched, data=position)
        for step in range(start, run.total_steps):
            with run.autocast():
                loss = loss_fn(net(x), y)
            run.backward(loss)
            run.step(opt, clip_norm=1.0)
            sched.step()
            run.end_step(step + 1, loss=loss, samples=batch * run.world.size)

It is the one implementation of the attempt's precision, numeric guard, checkpoints and
exact resume, progress metrics, preemption and exit code + termination report: the builtin
trainer (`python -m mpjob_trainer`) is a loop on this same API. docs/sdk.md has the whole
story; the parts: `run` (Session), `state` (what a checkpoint holds), `checkpointing`,
`progress` (metrics and event lines), `ending` (exit code and report), `preemption`,
`attempt` (the AttemptLaunch).
"""

from __future__ import annotations

import contextlib

from mpjob_trainer import distributed as dist_env
from mpjob_trainer.distributed import World
from mpjob_trainer.errors import ConfigError, NumericFault, Preempted
from mpjob_trainer.events import EventLog
from mpjob_trainer.session.attempt import LaunchSource, read_launch
from mpjob_trainer.session.ending import Standing, conclude
from mpjob_trainer.session.preemption import PreemptionFlag
from mpjob_trainer.session.run import Session

__all__ = ["ConfigError", "NumericFault", "Preempted", "Session", "World", "start"]


def start(
    flops_per_sample: float | None = None,
    tokens_per_sample: int | None = None,
    *,
    launch: LaunchSource = None,
) -> Session:
    """Join the attempt: read it (MPJOB_LAUNCH, or `launch`: an AttemptLaunch or a file), find
    this process's rank and device, join the process group, catch SIGTERM, resolve the
    precision, serve metrics (rank 0) and seed the generators.

    A failure here ends the process like a failure inside the session: report, then
    SystemExit with the contract's code (43 for a bad attempt description).
    """
    world = dist_env.world_from_env()
    log = EventLog(world.rank)
    preemption = PreemptionFlag()
    preemption.install()  # first: a SIGTERM during set-up is honoured at the first step
    try:
        return Session(
            read_launch(launch),
            world,
            log,
            preemption,
            flops_per_sample=flops_per_sample,
            tokens_per_sample=tokens_per_sample,
        )
    except BaseException as exc:
        code = conclude(exc, Standing(), log)
        with contextlib.suppress(Exception):
            dist_env.shutdown(world)
        preemption.restore()
        raise SystemExit(code) from None
