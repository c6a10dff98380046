"""The wait before an attempt that retries a failure as it was, as the operator waits it
(`mpjob.planning.backoff`): said in one line, recorded in report.json's Running condition, and
cut short by the user's stop (the runner then ends the run before the attempt starts)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from mpjob.planning import backoff
from mpjob.planning import status as st
from mpjob.planning.plan import Plan, When
from mpjob_contract.api import MixedPrecisionJobStatus

if TYPE_CHECKING:
    from mpjob.localrun.progress import ProgressView
    from mpjob.localrun.stops import CtrlC


def wait_out(
    status: MixedPrecisionJobStatus,
    retries: backoff.RetryBackoff,
    *,
    view: ProgressView,
    ctrl_c: CtrlC,
    save: Callable[[], None],
) -> None:
    """Wait until the newest attempt (recorded, not started) is due, or the user stops the run."""
    said = None
    while not ctrl_c.stop_asked():
        now = datetime.now(UTC)
        wait = backoff.held(Plan(status=status), When(st.stamp(now)), retries, now)
        if wait is None:
            return
        if wait.message != said:
            view.info(wait.message)
            save()
            said = wait.message
        ctrl_c.pause(wait.left(now))
