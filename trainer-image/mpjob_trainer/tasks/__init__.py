"""Tasks: what to train. Built-in workloads and user factories share one contract.

A task has `model` (an nn.Module built in fp32), `dataset` (a map-style Dataset of
(input, target) pairs), `loss(output, target) -> Tensor`, and optionally
`flops_per_sample` (for MFU), `tokens_per_sample` (for tokens/s) and
`set_step(step)` (workloads whose behaviour depends on the step, such as the built-ins'
activation blow-up switch) and `eval_dataset` (held-out (input, target) pairs: the quality
gate of spec.validation evaluates on them) and `blocks` (the model's repeated blocks: FSDP2 and
activation checkpointing work per block, spec.parallelism).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from mpjob_contract import builtin_args
from mpjob_contract.api import Task as TaskSpec
from mpjob_trainer.errors import ConfigError


@dataclass
class Task:
    model: nn.Module
    dataset: Dataset[Any]
    loss: Callable[[Any, Any], torch.Tensor]
    flops_per_sample: float | None = None
    tokens_per_sample: int | None = None
    set_step: Callable[[int], None] | None = None
    eval_dataset: Dataset[Any] | None = None
    #: The model's repeated blocks (transformer layers): FSDP2 shards and activation
    #: checkpointing recomputes per block (spec.parallelism); None: the model is one unit.
    blocks: list[nn.Module] | None = None


def _factory(spec: TaskSpec) -> Callable[[dict[str, Any]], Any]:
    if spec.builtin == "gpt":
        from mpjob_trainer.tasks.gpt import make_task

        return make_task
    if spec.builtin == "mlp":
        from mpjob_trainer.tasks.mlp import make_task as make_mlp

        return make_mlp
    assert spec.module is not None
    module_name, _, func_name = spec.module.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"task.module {spec.module!r}: cannot import {module_name!r}: {exc!r}") from exc
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ConfigError(f"task.module {spec.module!r}: {module_name} has no callable {func_name!r}")
    return factory  # type: ignore[no-any-return]


def load_task(spec: TaskSpec) -> Task:
    """Build the task named by the spec; any failure is a configuration error."""
    factory = _factory(spec)
    name = spec.builtin or spec.module
    try:
        made = factory(dict(spec.args))
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"task {name!r}: the factory raised {exc!r}") from exc
    if isinstance(made, Task):
        task = made
    else:
        missing = [a for a in ("model", "dataset", "loss") if not hasattr(made, a)]
        if missing:
            raise ConfigError(f"task {name!r}: the factory's result has no {', '.join(missing)}")
        # Every attribute a Task has, the optional ones (blocks, ...) too: one left out here is
        # taken from a Task and dropped from any other object, without a word.
        given: dict[str, Any] = {f.name: getattr(made, f.name, None) for f in fields(Task)}
        task = Task(**given)
    if not isinstance(task.model, nn.Module):
        raise ConfigError(f"task {name!r}: model is {type(task.model).__name__}, not an nn.Module")
    if not callable(task.loss):
        raise ConfigError(f"task {name!r}: loss is not callable")
    try:
        size = len(task.dataset)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(f"task {name!r}: dataset is not a map-style Dataset (no len())") from exc
    if size < 1:
        raise ConfigError(f"task {name!r}: dataset is empty")
    return task


def task_args(builtin: str, args: dict[str, Any]) -> dict[str, Any]:
    """A builtin workload's args, checked by the contract's one reading of them (as `mpjob validate`
    and the operator check them), a bad one a ConfigError naming its field."""
    try:
        builtin_args.check(builtin, args)
    except builtin_args.BadTaskArg as exc:
        raise ConfigError(str(exc)) from exc
    return args
