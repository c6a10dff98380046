"""A precision that faults again after a re-promotion into it is not re-promoted to again, however
many attempts come after: attempts[] keeps only the first and the newest entries, so the bar is
kept in status.attemptCounts, not read from the entries that showed it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mpjob.planning.lifecycle import Plan
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MAX_ATTEMPT_ENTRIES, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import CheckpointRef, TerminationReport

pytestmark = pytest.mark.unit
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SPEC = MixedPrecisionJobSpec.model_validate(
    {
        "task": {"builtin": "mlp"},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "repromoteAfterSteps": 5, "inPlace": False},
        "runPolicy": {"maxAttempts": 10},
    }
)


def ended(status: MixedPrecisionJobStatus, reason: Reason, code: int, *, platform: str | None = None) -> Plan:
    """The running attempt's pod ended as `reason` says (`platform`: the cluster's word on it)."""
    current = status.attempts[-1]
    ref = CheckpointRef(step=10, path="/checkpoints/step-10", sha256="ab", precision=current.precision)
    said = TerminationReport(reason=reason, step=10, precision=current.precision, last_good_checkpoint=ref)
    pod = PodView("p", 0, "Failed", False, code, said.to_message(), platform_reason=platform)
    return reconcile(SPEC, status, 1, {current.index: JobView(current.index, "Failed", pods=(pod,))}, NOW)


def test_the_bar_on_a_precision_outlives_the_entries_that_showed_it() -> None:
    plan = ended(reconcile(SPEC, MixedPrecisionJobStatus(), 1, {}, NOW).status, Reason.NUMERIC_FAULT, 42)
    assert (plan.create[0].precision, plan.create[0].repromote_after_steps) == ("bf16", 5)
    plan = ended(plan.status, Reason.REPROMOTE, 47)
    assert (plan.create[0].precision, plan.create[0].promoted_from) == ("fp16", "bf16")
    plan = ended(plan.status, Reason.NUMERIC_FAULT, 42)  # fp16 faults again after its re-promotion
    assert (plan.create[0].precision, plan.create[0].repromote_after_steps) == ("bf16", None)
    for _ in range(MAX_ATTEMPT_ENTRIES + 5):  # evicted again and again: uncharged, the entries roll over
        plan = ended(plan.status, Reason.PREEMPTED, 44, platform="EvictionByEvictionAPI")
        assert (plan.create[0].precision, plan.create[0].repromote_after_steps) == ("bf16", None)
    assert not any(a.repromoted for a in plan.status.attempts)  # the re-promotion's entry is gone
    counts = plan.status.attempt_counts
    assert counts is not None and (counts.repromoted_at, counts.barred) == ({"fp16": 2}, ["fp16"])


def test_a_status_written_before_the_bar_was_counted_still_bars_from_its_entries() -> None:
    plan = ended(reconcile(SPEC, MixedPrecisionJobStatus(), 1, {}, NOW).status, Reason.NUMERIC_FAULT, 42)
    plan = ended(plan.status, Reason.REPROMOTE, 47)
    plan = ended(plan.status, Reason.NUMERIC_FAULT, 42)
    old = plan.status.model_copy(deep=True)
    assert old.attempt_counts is not None
    old.attempt_counts.repromoted_at, old.attempt_counts.barred = {}, []
    plan = ended(old, Reason.PREEMPTED, 44, platform="EvictionByEvictionAPI")
    assert (plan.create[0].precision, plan.create[0].repromote_after_steps) == ("bf16", None)
