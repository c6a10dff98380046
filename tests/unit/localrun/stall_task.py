"""A `task.module` factory for the progress-deadline tests (`mpjob run` and the operator): the
builtin mlp whose dataset, in the attempts `hangAfter` names ({attempt: samples}), blocks for
good once it has served that many samples, as a data loader does on a filesystem that stopped
answering. The trainer's metrics endpoint answers on (its own thread), showing a step that no
longer moves; worker 0 prints no further step line."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from torch.utils.data import Dataset

from mpjob_contract.launch import LAUNCH_ENV
from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.mlp import make_task as make_mlp


class Hanging(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], after: int | None) -> None:
        self.inner, self.after, self.served = inner, after, 0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if self.after is not None and self.served >= self.after:
            threading.Event().wait()  # never set: SIGTERM's handler runs, and the wait goes on
        self.served += 1
        return self.inner[index]


def make_task(args: dict[str, Any]) -> Task:
    after = {int(k): int(v) for k, v in (args.get("hangAfter") or {}).items()}
    task = make_mlp({k: v for k, v in args.items() if k != "hangAfter"})
    attempt = json.loads(os.environ[LAUNCH_ENV])["attempt"]
    task.dataset = Hanging(task.dataset, after.get(attempt))
    return task
