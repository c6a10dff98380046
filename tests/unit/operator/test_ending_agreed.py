"""What the ranks of an attempt agree on, its quarantine and an `auto` attempt's measurement, the
ending keeps whichever pod explains it: each pod's own report says them alike, but the pod that
explains the ending may carry its launcher's report for a rank killed from outside, which says
neither. Taken whole, an operator that read neither left status.skipped without the steps the
attempt skipped and the attempt named `auto`, measured by no one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from mpjob.planning.endings import JobView, PodView, outcome_of
from mpjob.planning.reconcile import reconcile
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import Measurement, TerminationReport
from mpjob_contract.skipping import Skipped

pytestmark = pytest.mark.unit

QUARANTINE = Skipped.model_validate({"count": 1, "samples": 4, "steps": [{"step": 12, "cause": "data"}]})
MEASURED = Measurement(step_seconds={"bf16": 0.1, "fp32": 0.2}, chosen="bf16")


def pod(index: int, report: TerminationReport) -> PodView:
    return PodView(f"worker{index}", index, "Failed", False, 1, report.to_message())


def test_a_pod_whose_launcher_reported_for_a_killed_rank_takes_what_its_peers_agreed() -> None:
    killed = TerminationReport(reason=Reason.INFRA_ERROR, message="local rank 0 (rank 0) was killed by SIGKILL")
    peer = TerminationReport(
        reason=Reason.INFRA_ERROR, step=61, start_step=0, precision="bf16", skipped=QUARANTINE, measurement=MEASURED
    )
    outcome = outcome_of(JobView(index=0, pods=(pod(0, killed), pod(1, peer))))
    assert outcome.report is not None and outcome.report.message.endswith("killed by SIGKILL")
    assert (outcome.report.skipped, outcome.report.measurement) == (QUARANTINE, MEASURED)


def test_the_explaining_pods_own_quarantine_stands_when_no_peer_skipped_more() -> None:
    more = QUARANTINE.model_copy(update={"count": 2, "samples": 8})
    own = TerminationReport(reason=Reason.NON_FINITE_IN_FP32, step=61, skipped=more, measurement=MEASURED)
    stopped = TerminationReport(reason=Reason.PREEMPTED, step=61, skipped=QUARANTINE)
    outcome = outcome_of(JobView(index=0, pods=(pod(0, stopped), pod(1, own))))
    assert outcome.report is not None and outcome.report.reason == "NonFiniteInFp32"
    assert (outcome.report.skipped, outcome.report.measurement) == (more, MEASURED)


def test_a_pod_whose_launcher_reported_for_a_killed_rank_takes_the_progress_its_peers_reported() -> None:
    """The launcher's report for a one-rank pod whose rank was killed carries no progress (step 0,
    no start step); within a pod the launcher takes it from the lowest rank's report, across pods
    nothing did. Two attempts killed so at step 61, no live reading having seen them, ended the job
    'failed the same way before their first step', each attempt's endStep 0."""
    spec = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "precision": {"mode": "bf16"}, "runPolicy": {"maxAttempts": 5}}
    )
    killed = TerminationReport(reason=Reason.INFRA_ERROR, message="local rank 0 (rank 0) was killed by SIGKILL")
    peer = TerminationReport(reason=Reason.INFRA_ERROR, step=61, start_step=0, precision="bf16", message="lost peer")
    pods = (pod(0, killed), pod(1, peer))
    outcome = outcome_of(JobView(index=0, pods=pods))
    assert outcome.report is not None and outcome.report.message.endswith("killed by SIGKILL")
    assert (outcome.report.step, outcome.report.start_step, outcome.report.precision) == (61, 0, "bf16")
    now = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    status = reconcile(spec, MixedPrecisionJobStatus(), 2, {}, now).status
    for _ in range(2):
        index, now = status.attempts[-1].index, now + timedelta(minutes=10)
        status = reconcile(spec, status, 2, {index: JobView(index, "Failed", pods=pods)}, now).status
    assert status.phase == "Failed" and [a.end_step for a in status.attempts] == [61, 61]
    assert "failed the same way at step 61" in (status.message or "")
