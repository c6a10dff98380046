"""The changes in place an attempt's ending lists are every change its processes made, whichever
pod explains it: the ranks change together, so each pod that reported lists them all, but the
pod that explains the ending may carry its launcher's report for a rank killed from outside,
which lists none. Taken whole, it left an operator that read none of the changes recording the
attempt the processes had left, and the next attempt restarted in the precision that faulted."""

from __future__ import annotations

import pytest

from mpjob.planning.endings import JobView, PodView, outcome_of
from mpjob_contract.codes import Reason
from mpjob_contract.report import InPlaceChange, TerminationReport

pytestmark = pytest.mark.unit

FALLBACK = InPlaceChange.model_validate(
    {"kind": "fallback", "attempt": 2, "step": 50, "startStep": 40, "fromPrecision": "fp16",
     "toPrecision": "bf16", "rule": "maxConsecutiveOverflows", "recoverySeconds": 3.0}
)  # fmt: skip


def pod(index: int, report: TerminationReport) -> PodView:
    return PodView(f"worker{index}", index, "Failed", False, 1, report.to_message())


def test_a_pod_whose_launcher_reported_for_a_killed_rank_takes_the_changes_its_peers_listed() -> None:
    killed = TerminationReport(reason=Reason.INFRA_ERROR, message="local rank 0 (rank 0) was killed by SIGKILL")
    peer = TerminationReport(
        reason=Reason.INFRA_ERROR, step=61, start_step=40, precision="bf16", precision_changes=[FALLBACK]
    )
    outcome = outcome_of(JobView(index=1, pods=(pod(0, killed), pod(1, peer))))
    assert outcome.report is not None and outcome.report.message.endswith("killed by SIGKILL")
    assert outcome.report.precision_changes == [FALLBACK]


def test_the_explaining_pods_own_changes_stand_when_no_peer_listed_more() -> None:
    own = TerminationReport(reason=Reason.NUMERIC_FAULT, step=61, precision="bf16", precision_changes=[FALLBACK])
    stopped = TerminationReport(reason=Reason.PREEMPTED, step=61, precision="bf16")
    outcome = outcome_of(JobView(index=1, pods=(pod(0, stopped), pod(1, own))))
    assert outcome.report is not None and outcome.report.reason == "NumericFault"
    assert outcome.report.precision_changes == [FALLBACK]
