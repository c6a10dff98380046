"""The builtin training loop: a `task.builtin` or `task.module` task trained on the SDK.

It is a user loop like any other (mpjob_trainer.session): the session owns precision, the
numeric guard, checkpoints, metrics, preemption and the ending; this file owns what the
trainer promises for tasks it trains itself: AdamW (decay groups, fused on CUDA), warm-up +
cosine learning rate driven by *applied* steps, StepSampler's data order collated ahead by
DataLoader workers (StepLoader), gradient accumulation with DDP's no_sync, and a compiled
model per training.compile. It reads top to bottom: set-up, resume, then each step's phases.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from mpjob_trainer.data import Origin, StepLoader, StepSampler, data_workers, to_device
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session import Session
from mpjob_trainer.sharding import accumulating
from mpjob_trainer.tasks import Task, load_task

__all__ = ["builtin_task", "forward_backward", "learning_rate", "train"]


def learning_rate(applied_steps: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of the peak, driven by *applied* steps only,
    so overflow-skipped steps do not advance the schedule."""
    if warmup and applied_steps < warmup:
        return peak * (applied_steps + 1) / warmup
    progress = min(1.0, (applied_steps - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def builtin_task(run: Session) -> Task:
    """The task this trainer trains; a `task.command` job is not one of them."""
    if run.spec.task.command is not None:
        raise ConfigError(
            "task.command jobs run your own command under mpjob-launch; `python -m mpjob_trainer` "
            "trains task.builtin and task.module tasks only (see docs/sdk.md)"
        )
    task = load_task(run.spec.task)
    run.set_sample_cost(flops=task.flops_per_sample, tokens=task.tokens_per_sample)
    return task


def train(run: Session) -> None:
    """Train the job's builtin or module task from the attempt's checkpoint to the last step; a
    sharded model changing precision in place is built and wrapped anew (Session.reentering)."""
    run.reentering(lambda: train_once(run))


def train_once(run: Session) -> None:
    """Build, wrap, resume and train to the last step (or until the session leaves the loop)."""
    tr = run.spec.training  # the attempt's: its micro-batch may be split (AttemptLaunch)
    task = builtin_task(run)
    model = task.model.to(run.device)  # fp32 master weights; autocast casts per op
    run.keep_fp32(model)  # and, in fp8 attempts, torchao's float8 linears (else compile or wrap would convert them)
    # FSDP2 shards the module itself (compile the sharded one); DDP wraps the compiled one.
    if run.spec.parallelism.strategy == "fsdp":
        net = run.compile(run.wrap(model, blocks=task.blocks))
    else:
        net = run.wrap(run.compile(model), blocks=task.blocks)
    optimizer = run.adamw(model, lr=tr.learning_rate, weight_decay=tr.weight_decay)
    start = run.resume(model=model, optimizer=optimizer)
    samples_per_step = tr.batch_size * tr.grad_accumulation * run.world.size
    sampler = StepSampler(
        len(task.dataset),  # type: ignore[arg-type]
        tr.batch_size,
        tr.grad_accumulation,
        run.world.size,
        run.world.rank,
        tr.seed,
        quarantine=run.quarantined,
        origin=data_origin(run, start, samples_per_step),
    )
    workers = data_workers(tr.data_workers, run.device)
    data = StepLoader(
        task.dataset, sampler, span=range(start, run.total_steps), workers=workers, pin=run.device.type == "cuda"
    )

    def one_step(step: int) -> None:
        """Optimizer step `step` (0-based): the schedule, every micro-batch, the update."""
        if task.set_step is not None:
            task.set_step(step)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(run.applied_steps, tr.steps, tr.learning_rate, tr.warmup_steps)
        micro_batches, sizes = data.passes(step)  # as many on every rank, padded where quarantined
        if micro_batches:  # else every rank's samples of the step are quarantined: nothing to train on
            forward_backward(run, net, task, micro_batches, sizes)
            run.step(optimizer, clip_norm=tr.grad_clip_norm)

    def reshape(micro: int, accumulation: int) -> None:
        """Another split of the same samples per step, in the same order (session.memory)."""
        sampler.batch, sampler.accumulation = micro, accumulation

    run.register_step(one_step, samples=sampler.step_indices, reshape=reshape)
    run.quarantined.screen = lambda indices: non_finite_alone(run, model, task, indices)
    if run.spec.validation.every_steps:
        if task.eval_dataset is None:
            raise ConfigError("validation.everySteps is set but the task has no evaluation set (eval_dataset)")
        run.evaluate_with(lambda: evaluate(run, model, task))
    try:
        for step in range(start, run.total_steps):
            run.run_step(step)  # one_step, out of device memory in a smaller micro-batch when allowed
            run.end_step(step + 1, samples=samples_per_step)
    finally:
        data.close()


def data_origin(run: Session, start: int, samples_per_step: int) -> Origin:
    """Where the data stream stands at the start step: the samples the checkpoint saw (exact
    when it was written by another number of processes), or start x samples per step for a
    checkpoint that kept no count."""
    return Origin(start, run.samples_seen if run.samples_seen or not start else start * samples_per_step)


def evaluate(run: Session, model: nn.Module, task: Task) -> float:
    """Mean loss over the first validation.batches batches of the task's evaluation set, under
    the session's autocast (the quality gate runs it in the attempt's precision and in fp32)."""
    assert task.eval_dataset is not None
    size, batch = len(task.eval_dataset), run.spec.training.batch_size  # type: ignore[arg-type]
    starts = range(0, min(size, run.spec.validation.batches * batch), batch)
    model.eval()
    try:
        losses = []
        for start in starts:
            items = [task.eval_dataset[i] for i in range(start, min(size, start + batch))]
            inputs, targets = to_device(default_collate(items), run.device)
            with run.autocast():
                losses.append(float(task.loss(model(inputs), targets)))
        return sum(losses) / len(losses)
    finally:
        model.train()


def non_finite_alone(run: Session, model: nn.Module, task: Task, indices: list[int]) -> list[int]:
    """The samples among `indices` whose fp32 loss is non-finite on their own (the data rung
    quarantines only them, not the whole step they were in)."""
    bad = []
    model.eval()  # no dropout: the screen draws nothing from the generators the catch-up replays
    try:
        with torch.no_grad():
            for index in indices:
                inputs, targets = to_device(default_collate([task.dataset[index]]), run.device)
                if not bool(torch.isfinite(task.loss(model(inputs), targets)).all()):
                    bad.append(index)
    finally:
        model.train()
    return bad


def forward_backward(run: Session, net: nn.Module, task: Task, micro_batches: list[Any], sizes: list[int]) -> None:
    """All micro-batches of one optimizer step (`sizes`: their samples); DDP all-reduces gradients on
    the last only. Each loss counts by its samples: the step's is the mean over this rank's samples
    (1/accumulation each when the micro-batches are alike); the session weighs each rank's by them.
    A pass of 0 samples pads the step (StepSampler.passes): its loss is multiplied by 0, so it
    trains and counts nothing, but joins the collectives every rank's passes meet in."""
    accumulation, total = len(micro_batches), sum(sizes)
    for micro, (batch, size) in enumerate(zip(micro_batches, sizes, strict=True)):
        inputs, targets = to_device(batch, run.device)
        with accumulating(net, last=micro == accumulation - 1):
            with run.autocast():
                loss = task.loss(net(inputs), targets)
                loss = loss / (total / size) if size else loss * 0.0
            run.backward(loss, samples=size)
