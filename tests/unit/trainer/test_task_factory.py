"""A `task.module` factory may return any object with the task's attributes, not only a Task:
what it says about itself (the optional attributes too) reaches the trainer as a Task would."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from mpjob_contract.spec import Task as TaskSpec
from mpjob_trainer.tasks import load_task

pytestmark = pytest.mark.unit


def plain_object(args: dict[str, Any]) -> SimpleNamespace:
    """A factory whose result is a plain object with every attribute a Task has."""
    blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 4))
    return SimpleNamespace(
        model=nn.Sequential(*blocks),
        dataset=data,
        loss=nn.functional.mse_loss,
        flops_per_sample=96.0,
        tokens_per_sample=1,
        set_step=lambda step: None,
        eval_dataset=data,
        blocks=blocks,
    )


def test_a_plain_objects_optional_attributes_reach_the_task_its_blocks_too() -> None:
    task = load_task(TaskSpec(module=f"{__name__}:plain_object"))
    assert task.flops_per_sample == 96.0 and task.tokens_per_sample == 1 and task.eval_dataset is not None
    assert task.blocks is not None, "the factory's blocks were dropped: FSDP2 would shard the model as one unit"
    assert len(task.blocks) == 2
    assert all(any(b is m for m in task.model.modules()) for b in task.blocks)  # the model's own blocks
