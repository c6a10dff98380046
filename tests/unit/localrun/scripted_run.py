"""A local run whose trainers are stood in for by scripted event lines (no process starts): the
harness of the Ctrl-C tests (`test_stops.py`, `test_stopped_before_training.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mpjob.localrun.runner import LocalRun
from mpjob.localrun.stops import Stop
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.planner import StartAttempt
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJob

JOB: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "stops"},
    "spec": {
        "task": {"builtin": "mlp"},
        "training": {"steps": 300, "batchSize": 4, "logEvery": 10},
        "precision": {"mode": "bf16"},
        "checkpoint": {"everySteps": 50},
        "resources": {"gpusPerWorker": 0},
    },
}


def line(name: str, **fields: Any) -> events.TrainerEvent:
    event = events.parse_line(events.format_line(name, {"time": 1000.0, **fields}))
    assert event is not None
    return event


def started(at: int) -> events.TrainerEvent:
    fields = {"attempt": 0, "precision": "bf16", "requestedPrecision": "bf16", "device": "cpu", "worldSize": 1}
    return line("start", **fields, startStep=at, totalSteps=300)


def step(n: int) -> events.TrainerEvent:
    return line("step", step=n, loss=2.5)


def checkpoint(n: int, out: Path | None = None) -> events.TrainerEvent:
    where = str(out / "checkpoints" / f"step-{n:09d}") if out else f"/c/step-{n:09d}"
    return line("checkpoint", step=n, path=where, sha256=f"{n:064x}", seconds=0.1, bytes=9, **{"async": False})


class Shown:
    """A view that keeps the lines it was asked to show."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str, **fields: Any) -> None:
        self.lines.append(text)

    def attempt_ended(self, attempt: int, precision: str, reason: str, message: str) -> None:
        self.lines.append(f"attempt {attempt} ended: {reason}: {message}")

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Signalled:
    """Workers that keep the signals they were sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def signal(self, sig: int) -> None:
        self.sent.append(sig)


class Scripted(LocalRun):
    """A local run whose attempts print `lines`, then end as `ending` says."""

    def __init__(self, out: Path, lines: list[events.TrainerEvent]) -> None:
        super().__init__(MixedPrecisionJob.model_validate(JOB), out, Shown())  # type: ignore[arg-type]
        self.lines = lines

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        self._current, self._reached = start, None
        for event in self.lines:
            self._event(event)
        return self.ending()

    def ending(self) -> AttemptOutcome:
        raise NotImplementedError


class Killed(Scripted):
    """A local run whose one attempt prints `lines`, then is killed by a second Ctrl-C."""

    def ending(self) -> AttemptOutcome:
        self.ctrl_c.stop = Stop.KILLED
        return AttemptOutcome(137, None, message="the trainer exited 137 without a report")
