"""The child store's FailedCreate Events, one held per Job (its latest), are found by their
Event UID when the API server removes one: a deletion reads no other held failure, however
many are held (it read all of them once, a cost per deletion that grew with the cluster)."""

from __future__ import annotations

import pytest

from mpjob.controller.children import Children
from mpjob.controller.create_failures import CreateFailure
from mpjob.controller.ownership import ObjectRef

pytestmark = pytest.mark.unit


class Compared(str):
    """An Event UID that counts how often it is compared with another (a scan compares each)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Compared.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def failure(uid: str, job: int, message: str = "forbidden") -> CreateFailure:
    return CreateFailure(uid, ObjectRef("ns", "Job", f"j{job}-a0", f"job-{job}"), message)


def test_removing_one_failed_create_reads_no_other_held_one() -> None:
    children = Children()
    for job in range(2000):
        children.put(failure(Compared(f"ev-{job}"), job))
    Compared.compared = 0
    for job in range(0, 2000, 100):
        children.drop("events", f"ev-{job}")
    assert Compared.compared <= 20, f"{Compared.compared} comparisons for 20 deletions: a scan of every failure"
    assert len(children.held("events")) == 1980 and "ev-100" not in children.held("events")


def test_a_jobs_latest_failure_is_the_one_held_and_goes_only_by_its_own_uid() -> None:
    children = Children()
    children.put(failure("ev-old", 0, "quota"))
    children.put(failure("ev-new", 0, "PodSecurity"))  # the Job's latest replaces it
    assert set(children.held("events")) == {"ev-new"}
    children.drop("events", "ev-old")  # the older Event removed: the latest stays
    assert set(children.held("events")) == {"ev-new"}
    children.drop("events", "ev-new")
    assert children.held("events") == {}
    children.put(failure("ev-new", 0, "PodSecurity"))
    children.drop("events", "ev-unknown")
    assert set(children.held("events")) == {"ev-new"}
