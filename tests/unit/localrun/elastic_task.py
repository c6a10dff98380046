"""A `task.module` factory for the elastic run's test: the builtin mlp whose dataset appends
`<attempt> <rank> <index>` for every sample it serves to the file named by $MPJOB_TEST_RECORD,
so a test sees which samples each process of each attempt trained, in order."""

from __future__ import annotations

import json
import os
from typing import Any

from torch.utils.data import Dataset

from mpjob_contract.launch import LAUNCH_ENV
from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.mlp import make_task as make_mlp


class Recording(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], path: str, who: str) -> None:
        self.inner, self.path, self.who = inner, path, who

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        with open(self.path, "a") as f:
            f.write(f"{self.who} {index}\n")
        return self.inner[index]


def make_task(args: dict[str, Any]) -> Task:
    task = make_mlp(args)
    attempt = json.loads(os.environ[LAUNCH_ENV])["attempt"]
    task.dataset = Recording(task.dataset, os.environ["MPJOB_TEST_RECORD"], f"{attempt} {os.environ['RANK']}")
    return task
