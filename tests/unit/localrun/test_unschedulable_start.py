"""`mpjob run --workers-available`: an attempt whose workers do not all fit when it starts ends
before any trainer runs, as itself: its entry ends ScaledDown and the next attempt, in its
precision, goes on with the workers that fit. The runner's trainers are stood in for by a script
of endings (no process starts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun.elastic import WorkersSchedule
from mpjob.localrun.runner import LocalRun
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.elastic import Resize, Verdict
from mpjob.planning.planner import BatchShape, StartAttempt
from mpjob_contract.api import MixedPrecisionJob
from mpjob_contract.report import TerminationReport

pytestmark = pytest.mark.unit

JOB: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "elastic"},
    "spec": {
        "workers": 3,
        "task": {"builtin": "mlp"},
        "training": {"steps": 80, "batchSize": 4, "logEvery": 1},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "inPlace": False},
        "checkpoint": {"everySteps": 10},
        "elastic": {"minWorkers": 2},
        "resources": {"gpusPerWorker": 0},
    },
}


class Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Scripted(LocalRun):
    """A local run whose attempts end as `endings` say, in order; `ran` records each one run."""

    def __init__(self, out: Path, schedule: WorkersSchedule, endings: list[tuple[int, AttemptOutcome]]) -> None:
        super().__init__(MixedPrecisionJob.model_validate(JOB), out, Quiet(), schedule=schedule)  # type: ignore[arg-type]
        self.endings, self.ran = endings, list[StartAttempt]()

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        self.ran.append(start)
        self._current = start
        reached, outcome = self.endings.pop(0)
        assert self.schedule is not None
        self.schedule.available(reached)  # the steps its lines showed
        return outcome


def ending(reason: str, step: int, precision: str, code: int) -> AttemptOutcome:
    ckpt = {"step": step, "path": f"/ckpt/step-{step}", "sha256": "ab", "precision": precision}
    report = TerminationReport.model_validate(
        {"reason": reason, "step": step, "precision": precision, "lastGoodCheckpoint": ckpt}
    )
    return AttemptOutcome(code, report)


def test_an_attempt_that_does_not_fit_at_its_start_ends_as_itself_in_its_own_precision(tmp_path: Path) -> None:
    # 3 fit until step 45, then 2: the fp16 attempt faults at step 45 (its lines showed it), and
    # the bf16 attempt that follows on 3 workers cannot start on the 2 that fit.
    schedule = WorkersSchedule.parse("3,45:2")
    run = Scripted(tmp_path, schedule, [(45, ending("NumericFault", 40, "fp16", 42)), (80, AttemptOutcome(0))])
    status = run.run()
    assert [(s.index, s.precision, s.workers) for s in run.ran] == [(0, "fp16", None), (2, "bf16", 2)]
    assert [(a.index, a.precision, a.reason, a.world_size) for a in status.attempts] == [
        (0, "fp16", "NumericFault", 3),
        (1, "bf16", "ScaledDown", 3),
        (2, "bf16", "Succeeded", 2),
    ]


def test_a_grown_attempt_that_no_longer_fits_ends_scaled_down(tmp_path: Path) -> None:
    # 2 fit at first, 3 from step 40 (the job grows at its checkpoint at 50), 2 again from 45.
    schedule = WorkersSchedule.parse("2,40:3,45:2")
    grow = Resize(Verdict.GROW, 3, BatchShape(4, 1), "the cluster holds 3 worker(s) again: 2 -> 3")
    endings = [(50, AttemptOutcome(44, ending("Preempted", 50, "fp16", 44).report, resize=grow))]
    run = Scripted(tmp_path, schedule, [*endings, (80, AttemptOutcome(0))])
    status = run.run()
    assert [(s.index, s.workers) for s in run.ran] == [(1, 2), (3, 2)]
    assert [(a.index, a.reason, a.world_size) for a in status.attempts] == [
        (0, "ScaledDown", 3),
        (1, "ScaledUp", 2),
        (2, "ScaledDown", 3),
        (3, "Succeeded", 2),
    ]


def test_an_attempt_that_does_not_fit_at_its_start_says_why_without_a_wait_it_never_had(tmp_path: Path) -> None:
    run = Scripted(tmp_path, WorkersSchedule.parse("2"), [(80, AttemptOutcome(0))])
    first = run.run().attempts[0]
    assert (first.reason, first.message) == (
        "ScaledDown",
        "pods unschedulable at the attempt's start (a local run does not wait out elastic.waitSeconds=300);"
        " the cluster holds 2 worker(s): 3 -> 2",
    )
