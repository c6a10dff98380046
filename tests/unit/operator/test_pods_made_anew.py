"""The same attempt's pods made anew (its Job deleted and created again, or its queue's
preemption and readmission) over checkpoints kept in the pod (emptyDir): the new pods start at
step 0, and the status records that start and the checkpoints they write, never the old pods'
that went with them. On a claim or in a bucket they resume from the newest checkpoint, and the
attempt keeps the step it began at."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from mpjob.planning.endings import JobView, PodView
from mpjob.planning.observe import CheckpointReading, Reading, observe
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.report import InPlaceChange
from tests.unit.operator.test_pod_checkpoints import IN_POD, NOW, OUTLIVING, running_past, spec

pytestmark = pytest.mark.unit
OLD = PodView("p0", 0, "Running", True, started_at=NOW.isoformat())
NEW = PodView("p0-again", 0, "Running", True, started_at=(NOW + timedelta(seconds=90)).isoformat())
#: Where the new pods' trainer says it began, and the checkpoint it writes next, per storage.
GOES_ON = {**{where: 0 for where in IN_POD}, **{where: 200 for where in OUTLIVING}}


def in_place(where: str) -> tuple[MixedPrecisionJobSpec, MixedPrecisionJobStatus]:
    """Attempt 1, begun in place at checkpoint step 150 of attempt 0's pod, which has since
    checkpointed step 200 (read live), storage as `where` says."""
    s = spec({**IN_POD, **OUTLIVING}[where], resources={"gpusPerWorker": 1})
    change = InPlaceChange.model_validate(
        {"attempt": 1, "step": 160, "startStep": 150, "fromPrecision": "fp16", "toPrecision": "bf16",
         "rule": "MaxNonFiniteLosses", "message": "non-finite losses", "recoverySeconds": 0.2}
    )  # fmt: skip
    status = running_past(s, 150, OLD)
    status = reconcile(s, status, 1, {0: JobView(0, pods=(OLD,))}, NOW + timedelta(seconds=30), changes=[change]).status
    assert (status.attempts[-1].index, status.attempts[-1].start_step) == (1, 150)
    return s, observe(status, Reading(attempt=1, step=205, checkpoint=CheckpointReading(200, "ab"))).status


def made_anew(s: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus, where: str) -> MixedPrecisionJobStatus:
    """`status` once the new pods run and their trainer's first reading is taken: it began where
    `GOES_ON` says and checkpointed 50 steps further."""
    status = reconcile(s, status, 1, {1: JobView(1, pods=(NEW,))}, NOW + timedelta(seconds=100)).status
    assert status.phase == "Running"
    start = GOES_ON[where]
    said = Reading(attempt=1, step=start + 55, start_step=start, checkpoint=CheckpointReading(start + 50, "cd"))
    return observe(status, said).status


def start_and_checkpoint(status: MixedPrecisionJobStatus) -> tuple[int, Any]:
    ckpt = status.last_checkpoint
    return status.attempts[-1].start_step, ckpt.step if ckpt is not None else None


@pytest.mark.parametrize(("where", "seen"), [("default", (0, 50)), ("emptyDir", (0, 50)), ("claim", (150, 250))])
def test_a_deleted_job_made_again_records_where_its_new_pods_began_and_what_they_checkpoint(
    where: str, seen: tuple[int, int]
) -> None:
    s, status = in_place(where)
    plan = reconcile(s, status, 1, {}, NOW + timedelta(seconds=60))  # its Job deleted, its pod gone
    assert [(c.index, c.start_step) for c in plan.create] == [(1, seen[0])]
    if not s.checkpoint.outlives_pods:  # what the old pod wrote is named no more
        assert start_and_checkpoint(plan.status) == (0, None)
    assert start_and_checkpoint(made_anew(s, plan.status, where)) == seen


@pytest.mark.parametrize(("where", "held"), [("default", (0, None)), ("claim", (150, 200))])
def test_a_job_its_queue_preempts_starts_over_on_readmission_unless_its_checkpoints_outlive_its_pods(
    where: str, held: tuple[int, int | None]
) -> None:
    s, status = in_place(where)
    preempted = reconcile(s, status, 1, {0: JobView(0, suspended=True)}, NOW + timedelta(seconds=60)).status
    assert preempted.phase == "Pending" and start_and_checkpoint(preempted) == held
    readmitted = reconcile(s, preempted, 1, {0: JobView(0, pods=(NEW,))}, NOW + timedelta(seconds=100)).status
    assert readmitted.phase == "Running"
    start = GOES_ON[where]
    said = Reading(attempt=1, step=start + 55, start_step=start, checkpoint=CheckpointReading(start + 50, "cd"))
    start_now, ckpt = start_and_checkpoint(observe(readmitted, said).status)
    assert ckpt == start + 50  # the new pods' checkpoint, below the old one's step where they started over
    if not s.checkpoint.outlives_pods:
        assert start_now == 0
