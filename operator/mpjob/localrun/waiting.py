"""The wait before an attempt that retries a failure as it was, as the operator waits it
(`mpjob.planning.backoff`): said in one line, recorded in report.json's Running condition, and
cut short by the user's stop (the runner then ends the run before the attempt starts) and by
runPolicy.activeDeadlineSeconds: the operator fails a job at its deadline, its Job not made,
so an attempt due after it never starts (`past_due`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from mpjob.planning import backoff
from mpjob.planning import status as st
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.endings import DEADLINE_EXCEEDED
from mpjob.planning.plan import Plan, When
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus

if TYPE_CHECKING:
    from mpjob.localrun.progress import ProgressView
    from mpjob.localrun.stops import CtrlC


def wait_out(
    spec: MixedPrecisionJobSpec,
    status: MixedPrecisionJobStatus,
    retries: backoff.RetryBackoff,
    *,
    view: ProgressView,
    ctrl_c: CtrlC,
    save: Callable[[], None],
) -> None:
    """Wait until the newest attempt (recorded, not started) is due, the job's deadline passes, or
    the user stops the run."""
    said = None
    while not ctrl_c.stop_asked():
        now = datetime.now(UTC)
        wait = backoff.held(Plan(status=status), When(st.stamp(now)), retries, now)
        if wait is None or st.deadline_passed(spec, status, now):
            return
        if wait.message != said:
            view.info(wait.message)
            save()
            said = wait.message
        deadline = st.until_deadline(spec, status, now)
        ctrl_c.pause(wait.left(now) if deadline is None else min(wait.left(now), deadline))


def past_due(spec: MixedPrecisionJobSpec, status: MixedPrecisionJobStatus) -> AttemptOutcome | None:
    """The ending of the next attempt, not started: the job's deadline passed while it waited (None:
    it starts), as the operator ends a job whose deadline passed without making the attempt's Job."""
    return DEADLINE_EXCEEDED if st.deadline_passed(spec, status, datetime.now(UTC)) else None
