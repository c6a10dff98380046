"""A `task.module` factory for the elastic run's test: the builtin mlp whose dataset appends
`<attempt> <rank> <index>` for every sample it serves to the file named by $MPJOB_TEST_RECORD,
so a test sees which samples each process of each attempt trained, in order. `sampleDelay`
({attempt: seconds}) slows the samples one attempt serves: a test that changes the job while
that attempt trains keeps it from training to its end first, however fast its ranks start."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from torch.utils.data import Dataset

from mpjob_contract.launch import LAUNCH_ENV
from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.mlp import make_task as make_mlp


class Recording(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], path: str, who: str, delay: float = 0.0) -> None:
        self.inner, self.path, self.who, self.delay = inner, path, who, delay

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        with open(self.path, "a") as f:
            f.write(f"{self.who} {index}\n")
        if self.delay:
            time.sleep(self.delay)
        return self.inner[index]


def make_task(args: dict[str, Any]) -> Task:
    delays = {int(k): float(v) for k, v in (args.get("sampleDelay") or {}).items()}
    task = make_mlp({k: v for k, v in args.items() if k != "sampleDelay"})
    attempt = json.loads(os.environ[LAUNCH_ENV])["attempt"]
    who = f"{attempt} {os.environ['RANK']}"
    task.dataset = Recording(task.dataset, os.environ["MPJOB_TEST_RECORD"], who, delays.get(attempt, 0.0))
    return task
