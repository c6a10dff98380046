"""The ticker leaves settled jobs alone: a finished job whose children are gone costs no tick."""

from __future__ import annotations

import pytest

from mpjob.controller.ticker import due, has_work

pytestmark = pytest.mark.unit


def test_finished_jobs_whose_children_are_gone_are_not_ticked() -> None:
    ttl = {"runPolicy": {"ttlSecondsAfterFinished": 60}}
    index = {
        ("ns", "running"): [has_work({"phase": "Running"}, {})],
        ("ns", "ttl-pending"): [has_work({"phase": "Succeeded"}, ttl)],
        ("ns", "ttl-done"): [has_work({"phase": "Failed"}, ttl)],
        ("ns", "no-ttl"): [has_work({"phase": "Succeeded"}, {})],
    }
    assert due(index, settled=set()) == [("ns", "running"), ("ns", "ttl-done"), ("ns", "ttl-pending")]
    assert due(index, settled={("ns", "ttl-done")}) == [("ns", "running"), ("ns", "ttl-pending")]
