"""An attempt begun in place runs in the Job of the first attempt of its chain, whose entry alone
holds that Job's UID (`attempts[].jobUid`). attempts[] is bounded (history.bound): an entry a
later attempt runs in is never dropped, so a restarted operator still knows the Job as its own
and stops what it left when it was deleted with --cascade=orphan (controller/leftovers.py)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from mpjob.controller.cache import ChildCache
from mpjob.planning import history
from mpjob.planning import status as st
from mpjob.planning.reconcile import JobView, PodView, reconcile
from mpjob_contract.api import MAX_ATTEMPT_ENTRIES, AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.unit.operator.test_cache import MPJ_UID
from tests.unit.operator.test_orphans import orphaned

pytestmark = pytest.mark.unit
AT = "2026-12-01T12:00:00Z"


def a_long_chain_in_place() -> MixedPrecisionJobStatus:
    """Attempt 0 ended; attempt 1's Job then ran MAX_ATTEMPT_ENTRIES + 2 attempts in place (splits
    of the micro-batch after running out of memory, one after another), the newest still running."""
    status = MixedPrecisionJobStatus()
    history.started(status, AttemptStatus(index=0, precision="fp16", job_uid="job-0", finish_time=AT))
    history.started(status, AttemptStatus(index=1, precision="fp16", job_uid="job-1"))
    for index in range(2, MAX_ATTEMPT_ENTRIES + 4):
        status.attempts[-1].finish_time = AT
        history.started(status, AttemptStatus(index=index, precision="fp16", in_place=True))
    return status


def test_the_entry_that_holds_the_running_chains_job_stays() -> None:
    status = a_long_chain_in_place()
    newest = status.attempts[-1].index
    assert history.job_index(status, newest) == 1  # the newest runs in attempt 1's Job
    assert st.job_uids(status) == {0: "job-0", 1: "job-1"}
    assert [a.index for a in status.attempts] == list(range(newest + 1))  # the chain is whole


def test_the_running_chains_job_is_followed_not_retired_nor_made_again() -> None:
    status = a_long_chain_in_place()
    status.phase = "Running"
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}})
    running = {1: JobView(1, pods=(PodView("j-a1-0", 0, "Running", alive=True),))}
    plan = reconcile(spec, status, None, running, datetime(2026, 12, 1, 12, 5, tzinfo=UTC))
    assert (plan.delete, plan.create, plan.status.phase) == ([], [], "Running")


def test_a_restarted_operator_stops_what_the_chains_job_left_when_deleted_leaving_its_pods() -> None:
    status = a_long_chain_in_place()
    c = ChildCache(lambda key: None)
    c.relist("jobs", "ns", [])  # attempt 1's Job was deleted with --cascade=orphan while the operator was away
    c.relist("pods", "ns", [orphaned(1)])
    seen = c.observe("ns", "j", MPJ_UID, recorded=st.job_uids(status))
    assert {a: [p.uid for p in pods] for a, pods in seen.orphans.items()} == {1: ["pod-1"]}


def test_once_the_chain_has_ended_its_entries_go_as_others_do() -> None:
    status = a_long_chain_in_place()
    status.attempts[-1].finish_time = AT
    after = status.attempts[-1].index + 1
    for index in range(after, after + MAX_ATTEMPT_ENTRIES):
        history.started(status, AttemptStatus(index=index, precision="bf16", finish_time=AT))
    assert len(status.attempts) == MAX_ATTEMPT_ENTRIES  # back to the bound, the chain gone at once
    assert status.attempts[0].index == 0 and all(not a.in_place for a in status.attempts[1:])
