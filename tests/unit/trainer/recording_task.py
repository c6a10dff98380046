"""A `task.module` factory for tests: the builtin mlp whose dataset appends every index it
serves to the file named by $MPJOB_TEST_RECORD, one per line, so a test sees the samples of
each optimizer step (the env, not task.args, names the file: args are part of the
checkpoint's config digest, and runs compared here share checkpoints)."""

from __future__ import annotations

import os
from typing import Any

from torch.utils.data import Dataset

from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.mlp import make_task as make_mlp


class Recording(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], path: str) -> None:
        self.inner = inner
        self.path = path

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        with open(self.path, "a") as f:
            f.write(f"{index}\n")
        return self.inner[index]


def make_task(args: dict[str, Any]) -> Task:
    task = make_mlp(args)
    task.dataset = Recording(task.dataset, os.environ["MPJOB_TEST_RECORD"])
    return task


def without_eval(args: dict[str, Any]) -> Task:
    """The mlp without its evaluation set: a task the quality gate cannot evaluate."""
    task = make_mlp(args)
    task.eval_dataset = None
    return task
