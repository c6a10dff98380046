"""`mpjob run`: runPolicy.activeDeadlineSeconds passing while the attempt after a failure waits its
backoff ends that attempt, never started, as the operator ends it for the same history: at the
step it was to begin at, the job Failed with the operator's message. The runner's trainers are
stood in for by a scripted ending (no process starts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from mpjob.localrun.runner import LocalRun
from mpjob.planning import reconcile as rc
from mpjob.planning.backoff import RetryBackoff
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJob, MixedPrecisionJobStatus
from mpjob_contract.report import TerminationReport

pytestmark = pytest.mark.unit

JOB: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "due"},
    "spec": {
        "task": {"builtin": "mlp"},
        "training": {"steps": 80, "batchSize": 4, "logEvery": 1},
        "precision": {"mode": "bf16"},
        "checkpoint": {"everySteps": 10},
        "resources": {"gpusPerWorker": 0},
        "runPolicy": {"activeDeadlineSeconds": 1},
    },
}
#: Minutes of backoff: the deadline passes long before the retry is due.
RETRIES = RetryBackoff(base=300)


class Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class Crashing(LocalRun):
    """Its one attempt that runs fails at step 28 (InfraError), its checkpoint at 20; `before` is
    the status as it stood once that attempt ended, the retry recorded to wait its backoff."""

    def __init__(self, out: Path) -> None:
        super().__init__(MixedPrecisionJob.model_validate(JOB), out, Quiet(), retries=RETRIES)  # type: ignore[arg-type]
        self.before: MixedPrecisionJobStatus | None = None

    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        assert start.index == 0, "the retry never starts"
        self._current = start
        ckpt = {"step": 20, "path": "/ckpt/step-20", "sha256": "ab", "precision": "bf16"}
        fields = {"reason": "InfraError", "step": 28, "precision": "bf16", "lastGoodCheckpoint": ckpt}
        return AttemptOutcome(1, TerminationReport.model_validate({**fields, "message": "store gone"}))

    def _conclude(self, start: StartAttempt, outcome: AttemptOutcome) -> StartAttempt | None:
        nxt = super()._conclude(start, outcome)
        self.before = self.before or self.status.model_copy(deep=True)
        return nxt


def test_an_attempt_due_after_the_deadline_ends_as_the_operator_ends_it(tmp_path: Path) -> None:
    run = Crashing(tmp_path)
    local = run.run()
    assert run.before is not None
    spec = run.job.spec
    cluster = rc.reconcile(spec, run.before, None, {}, datetime.now(UTC) + timedelta(seconds=5), retries=RETRIES)
    said = [(a.index, a.start_step, a.end_step, a.reason, a.message) for a in local.attempts]
    assert said == [
        (0, 0, 28, "InfraError", "store gone"),
        (1, 20, 20, "DeadlineExceeded", "runPolicy.activeDeadlineSeconds passed"),  # never trained
    ]
    assert said == [(a.index, a.start_step, a.end_step, a.reason, a.message) for a in cluster.status.attempts]
    assert (local.phase, local.message) == ("Failed", "runPolicy.activeDeadlineSeconds=1 passed")
    assert local.last_checkpoint is not None and local.last_checkpoint.step == 20  # on disk: it stays
