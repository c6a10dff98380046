"""One ranking of endings: the launcher folding a pod's ranks and the operator picking the pod
that explains an attempt both call `mpjob_contract.codes.ending_rank`."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from mpjob.planning.endings import JobView, PodView, outcome_of
from mpjob_contract.codes import ENDING_PRECEDENCE, Reason, ending_rank, exit_code_for, reason_for_exit_code
from mpjob_contract.report import TerminationReport
from mpjob_trainer.launch.fold import RankEnding, fold_endings

pytestmark = pytest.mark.unit

#: Most telling first; endings on one row rank alike.
TABLE: list[list[tuple[str | None, bool]]] = [
    [(Reason.CONFIG_ERROR, False), (Reason.CONFIG_ERROR, True)],
    [(Reason.NON_FINITE_IN_FP32, False), (Reason.NON_FINITE_IN_FP32, True)],
    [(Reason.NUMERIC_FAULT, False)],
    [(Reason.OUT_OF_DEVICE_MEMORY, False)],
    [(None, True), (Reason.INFRA_ERROR, True), (Reason.PREEMPTED, True), (Reason.SUCCEEDED, True)],  # the cluster's
    [(Reason.INFRA_ERROR, False), (Reason.OOM_KILLED, False), ("SomethingNew", False)],  # a crash
    [(Reason.REPROMOTE, False)],
    [(Reason.PREEMPTED, False)],
    [(Reason.SUCCEEDED, False), (None, False)],
]


def test_the_table_ranks_endings_in_the_contracts_order() -> None:
    places = [{ending_rank(reason, platform=platform) for reason, platform in row} for row in TABLE]
    assert all(len(row) == 1 for row in places), places
    assert [row.pop() for row in places] == list(range(len(TABLE)))
    assert sorted(ENDING_PRECEDENCE, key=ending_rank) == list(ENDING_PRECEDENCE)


def _ended(rank: int, code: int) -> RankEnding:
    """A rank that ended with `code` and, as the session does, the report of the code's reason."""
    return RankEnding(rank, rank, code, TerminationReport(reason=reason_for_exit_code(code)))


def test_a_pod_and_an_attempt_tell_the_same_story() -> None:
    """Two ranks of one pod and two one-rank pods ending alike are explained by the same ending."""
    for first, second in [(43, 42), (42, 1), (1, 44), (47, 44), (46, 1)]:
        folded = fold_endings([_ended(0, second), _ended(1, first)])
        pods = (PodView("p0", 0, "Failed", False, second), PodView("p1", 1, "Failed", False, first))
        assert folded.code == first == outcome_of(JobView(0, "Failed", pods=pods)).exit_code


def test_a_rank_killed_from_outside_explains_a_pod_and_an_attempt_alike() -> None:
    """Rank 1 was killed by a signal its launcher did not send (the OOM killer, a kill) and rank 0's
    collective failed because it was gone: both are crashes, and the killed one explains, whether
    the two are local ranks of one pod or the ranks of two pods. Across pods the tie went to the
    lowest pod, and the attempt named the failed collective, not the kill that caused it."""
    lost = TerminationReport(reason=Reason.INFRA_ERROR, step=30, start_step=0, message="Connection closed by peer")
    crashed, killed = RankEnding(0, 0, 1, lost), RankEnding(1, 1, -signal.SIGKILL)
    cause = "(rank 1) was killed by SIGKILL"
    assert cause in fold_endings([crashed, killed]).report.message
    folded = [fold_endings([crashed]), fold_endings([RankEnding(0, 1, -signal.SIGKILL)])]
    pods = tuple(PodView(f"p{i}", i, "Failed", False, e.code, e.report.to_message()) for i, e in enumerate(folded))
    told = outcome_of(JobView(0, "Failed", pods=pods))
    assert told.exit_code == 1 and told.report is not None and cause in told.report.message


def test_the_launcher_page_lists_the_precedence_in_order() -> None:
    """docs/launcher.md's table: every class of the contract, highest first, with the pod's exit code."""
    page = (Path(__file__).resolve().parents[2] / "docs/launcher.md").read_text()
    table = page.split("## One exit code, one report: the precedence", 1)[1].split("\n\n")[2]
    rows = [line.split("|")[1:4] for line in table.splitlines()[2:]]
    shown = [(name.strip(), code.split()[0]) for name, _, code in rows]
    assert shown == [(reason.value, str(int(exit_code_for(reason)))) for reason in ENDING_PRECEDENCE]
