"""Pods whose Job the cache does not hold (removed before the operator listed it): they are the
strays of the MixedPrecisionJob their Job's name names in their namespace, found by that name
alone (an index, not a scan of every Job's pods at every reconcile), and only while held."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.controller.cache import ChildCache
from tests.unit.operator.test_cache import MPJ_UID, owner, pod


def of(job: str, attempt: int, uid: str, namespace: str = "ns") -> dict[str, Any]:
    """A running rank-0 pod of the Job `<job>-a<attempt>` (UID `job-uid`), never listed."""
    made = pod(attempt)
    made["metadata"] |= {
        "uid": uid,
        "namespace": namespace,
        "ownerReferences": owner("Job", f"{job}-a{attempt}", "job-uid"),
    }
    return made


pytestmark = pytest.mark.unit


def test_strays_are_the_pods_of_jobs_named_for_that_job_in_its_namespace_only() -> None:
    c = ChildCache(lambda key: None)
    c.relist("pods", None, [of("j", 0, "p1"), of("j", 2, "p2"), of("j-a1", 0, "p3"), of("j", 0, "p4", "other")])
    assert c.observe("ns", "j", MPJ_UID).lingering == {0, 2}
    assert c.observe("ns", "j-a1", MPJ_UID).lingering == {0}  # the job named j-a1: its Job j-a1-a0
    assert c.observe("other", "j", MPJ_UID).lingering == {0}
    assert c.observe("ns", "k", MPJ_UID).lingering == frozenset()


def test_a_stray_goes_with_its_last_pod_and_one_that_moves_counts_under_its_new_job() -> None:
    c = ChildCache(lambda key: None)
    c.relist("pods", "ns", [of("j", 0, "p1"), of("j", 0, "p2")])
    c.apply("pods", "DELETED", of("j", 0, "p1"))
    assert c.observe("ns", "j", MPJ_UID).lingering == {0}  # p2 still runs
    c.apply("pods", "MODIFIED", of("j", 3, "p2"))  # its owner reference now names j-a3
    assert c.observe("ns", "j", MPJ_UID).lingering == {3}
    c.apply("pods", "DELETED", of("j", 3, "p2"))
    assert c.observe("ns", "j", MPJ_UID).lingering == frozenset()
