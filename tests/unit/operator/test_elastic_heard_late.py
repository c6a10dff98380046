"""A resize (spec.elastic) ended on the operator's word while its ranks ran, whose trainer changed
in place after the last read: the report its stopped pods leave lists the change (`cutoff.heard`),
and the smaller attempt already planned goes on in the precision the change went on in, at the
size the resize chose, with the global batch kept. Taking the change's split as it was on the
old size broke the global batch, and the next attempt went back to every worker: the shrink undone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning import status as st
from mpjob.planning.batch import global_batch
from mpjob.planning.endings import JobView, PodView
from mpjob.planning.planner import BatchShape
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import CheckpointRef, InPlaceChange, TerminationReport
from tests.unit.operator.cases import CLAIM
from tests.unit.operator.test_elastic import spec

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def change(to: str, **split: int) -> InPlaceChange:
    return InPlaceChange.model_validate(
        {"kind": "fallback", "attempt": 1, "step": 50, "startStep": 40, "fromPrecision": "fp16",
         "toPrecision": to, "rule": "MaxNonFiniteLosses", "message": "MaxNonFiniteLosses: 5 non-finite losses",
         "recoverySeconds": 0.5, "at": (NOW - timedelta(seconds=20)).timestamp(), **split}
    )  # fmt: skip


def stopped(changed: InPlaceChange) -> dict[int, JobView]:
    """Attempt 0's Job, gone: its two placed pods stopped on SIGTERM at step 87, checkpointed there."""
    ckpt = CheckpointRef(step=87, path="/ckpt/step-000000087", sha256="ab", precision=changed.to_precision)
    said = TerminationReport(
        reason=Reason.PREEMPTED, step=87, start_step=40, precision=changed.to_precision,
        last_good_checkpoint=ckpt, precision_changes=[changed],
    ).to_message()  # fmt: skip
    pods = tuple(
        PodView(f"j-a0-{i}", i, "Failed", False, exit_code=ExitCode.PREEMPTED, termination_message=said) for i in (0, 1)
    )
    return {0: JobView(0, pods=pods)}


@pytest.mark.parametrize(
    ("changed", "after"),
    [
        (change("bf16"), BatchShape(3, 2)),
        # fp16 -> fp32 under fallbackKeepsBatch: the trainer split 4 x 1 into 2 x 2 on 3 workers;
        # on 2 workers 6 samples a process, in micro-batches of at most 2.
        (change("fp32", microBatch=2, gradAccumulation=2), BatchShape(2, 3)),
    ],
)
def test_a_shrinks_late_fallback_keeps_the_smaller_size_and_the_global_batch(
    changed: InPlaceChange, after: BatchShape
) -> None:
    job = spec(checkpoint=CLAIM, precision={"mode": "fp16", "fallback": ["bf16", "fp32"], "fallbackKeepsBatch": True})
    first = reconcile(job, MixedPrecisionJobStatus(), 1, {}, NOW - timedelta(seconds=100)).status
    pods = (
        PodView("j-a0-0", 0, "Running", True, uid="u0"),
        PodView("j-a0-1", 1, "Running", True, uid="u1"),
        PodView("j-a0-2", 2, "Pending", True, uid="u2", unschedulable_since=st.stamp(NOW - timedelta(seconds=90))),
    )
    first.step = 45
    shrunk = reconcile(job, first, 1, {0: JobView(0, pods=pods)}, NOW).status
    assert [(a.reason, a.workers) for a in shrunk.attempts] == [(Reason.SCALED_DOWN, 3), (None, 2)]
    heard = reconcile(job, shrunk, 1, {}, NOW + timedelta(seconds=5), stopped=stopped(changed))
    ended, in_place, planned = heard.status.attempts
    assert (ended.reason, in_place.precision, in_place.reason) == (Reason.NUMERIC_FAULT, changed.to_precision,
                                                                     Reason.SCALED_DOWN)  # fmt: skip
    per_step = (planned.micro_batch or 0) * (planned.grad_accumulation or 0) * (planned.world_size or 0)
    assert (planned.precision, planned.workers, per_step) == (changed.to_precision, 2, global_batch(job))
    assert (planned.micro_batch, planned.grad_accumulation) == (after.micro_batch, after.grad_accumulation)
    assert [(c.precision, c.workers, c.shape, c.start_step) for c in heard.create] == [
        (changed.to_precision, 2, after, 87)
    ]  # its Job made in this reconcile: the old pods are gone
    assert heard.status.workers == 2
