"""A `task.module` factory for the progress-deadline tests (`mpjob run` and the operator) and the
cut tests: the builtin mlp whose dataset, in the attempts `hangAfter` names ({attempt: samples}),
blocks for good once it has served that many samples, as a data loader does on a filesystem
that stopped answering. The trainer's metrics endpoint answers on (its own thread), showing a
step that no longer moves; worker 0 prints no further step line. In the attempts `crashAfter`
names, every rank but 0 raises instead (a crash: exit 1) once it has served that many."""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from torch.utils.data import Dataset

from mpjob_contract.launch import LAUNCH_ENV
from mpjob_trainer.tasks import Task
from mpjob_trainer.tasks.mlp import make_task as make_mlp

#: The job both tests run: attempt 0's data loader hangs after 25 steps of 4 samples, a
#: checkpoint every 10 steps, a 30 s deadline (its store is each test's own).
SPEC: dict[str, Any] = {
    "task": {
        "module": "tests.unit.localrun.stall_task:make_task",
        "args": {"inputs": 8, "hidden": 16, "samples": 256, "hangAfter": {"0": 25 * 4}},
    },
    "training": {"steps": 40, "batchSize": 4, "logEvery": 1},
    "precision": {"mode": "bf16", "fallback": ["fp32"]},
    "checkpoint": {"everySteps": 10},
    "resources": {"gpusPerWorker": 0},
    "runPolicy": {"progressDeadlineSeconds": 30},
}


def stalled_then_retried(status: dict[str, Any], source: str) -> None:
    """What both tests assert of the job's end: attempt 0 Stalled, charged, at the last step
    `source` showed; attempt 1 in the same precision from the step-20 checkpoint to Succeeded."""
    assert (status["phase"], status["step"]) == ("Succeeded", 40), status
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["charged"]) == ("bf16", "Stalled", True), first
    message = first["message"]
    assert "has not moved for" in message and f"as {source} showed (progressDeadlineSeconds=30)" in message, first
    assert first["endStep"] == 25, first
    assert (second["precision"], second["startStep"], second["reason"]) == ("bf16", 20, "Succeeded")


class Hanging(Dataset[Any]):
    def __init__(self, inner: Dataset[Any], after: int | None, crash: bool = False) -> None:
        self.inner, self.after, self.crash, self.served = inner, after, crash, 0

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        if self.after is not None and self.served >= self.after:
            if self.crash:
                raise RuntimeError(f"this rank crashes after {self.after} samples (crashAfter)")
            threading.Event().wait()  # never set: SIGTERM's handler runs, and the wait goes on
        self.served += 1
        return self.inner[index]


def make_task(args: dict[str, Any]) -> Task:
    hang, crash = ({int(k): int(v) for k, v in (args.get(key) or {}).items()} for key in ("hangAfter", "crashAfter"))
    task = make_mlp({k: v for k, v in args.items() if k not in ("hangAfter", "crashAfter")})
    attempt = json.loads(os.environ[LAUNCH_ENV])["attempt"]
    crashes = attempt in crash and int(os.environ.get("RANK") or 0) > 0
    task.dataset = Hanging(task.dataset, crash[attempt] if crashes else hang.get(attempt), crashes)
    return task
