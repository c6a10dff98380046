"""`mpjob run --workers-available`'s schedule: the workers that fit as the job moves on, its
clock the furthest step reached, so steps trained again after a resume keep today's capacity."""

from __future__ import annotations

import pytest

from mpjob.localrun.elastic import BadSchedule, WorkersSchedule

pytestmark = pytest.mark.unit


def test_the_workers_that_fit_follow_the_furthest_step_reached() -> None:
    schedule = WorkersSchedule.parse("3,20:2,35:3")
    assert [schedule.available(step) for step in (0, 19, 20, 21)] == [3, 3, 2, 2]
    # Resumed from the step-10 checkpoint after the loss at step 20: steps 11-19 come later in
    # time, when only 2 fit (a schedule read by the step alone grew the job back there).
    assert [schedule.available(step) for step in (11, 19, 34)] == [2, 2, 2]
    assert schedule.available(35) == 3 and schedule.available(23) == 3


@pytest.mark.parametrize("text", ["x", "3,20", "3,20:2,20:3", "3,30:2,20:3", "3,20:0"])
def test_a_schedule_that_cannot_be_read_is_refused(text: str) -> None:
    with pytest.raises(BadSchedule):
        WorkersSchedule.parse(text)
