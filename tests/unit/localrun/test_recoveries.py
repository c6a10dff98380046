"""attempts[].recoverySeconds as `mpjob run` clocks a restart from the trainers' lines: from the
`fault` line the previous attempt ended on to the `resume` (or `freshStart`) line of the attempt
after it."""

from __future__ import annotations

from typing import Any

import pytest

from mpjob.localrun.recoveries import RecoveryClock
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJobStatus

pytestmark = pytest.mark.unit

RESUMED = {"step": 50, "path": "/c/step-000000050", "sha256": "ab" * 32, "fromPrecision": "fp16"}


def line(name: str, at: float, **fields: Any) -> events.TrainerEvent:
    event = events.parse_line(events.format_line(name, {"time": at, **fields}))
    assert event is not None
    return event


def runs(*precisions: str) -> MixedPrecisionJobStatus:
    attempts = [{"index": i, "precision": p, "startStep": 50 if i else 0} for i, p in enumerate(precisions)]
    return MixedPrecisionJobStatus.model_validate({"attempts": attempts})


def test_the_attempt_after_a_fault_is_back_once_it_resumed() -> None:
    status, clock = runs("fp16", "bf16"), RecoveryClock()
    clock.seen(status, 0, line("fault", 100.0, step=60, rule="overflow", message="overflow"))
    clock.seen(status, 1, line("resume", 112.5, **RESUMED))
    assert status.attempts[1].recovery_seconds == 12.5


def test_an_attempt_that_follows_a_crash_is_not_clocked_from_a_fault_two_attempts_back() -> None:
    """Attempt 0 faulted, attempt 1 crashed before it resumed (no line of its own said it was
    back), attempt 2 resumed 300 s after the fault: its recovery is from attempt 1's end (its
    trainer's own figure, from its launch's recoveringSince, as on a cluster), not the fault's
    300 s, which hold attempt 1's whole run and the backoff after it."""
    status, clock = runs("fp16", "bf16", "bf16"), RecoveryClock()
    clock.seen(status, 0, line("fault", 100.0, step=60, rule="overflow", message="overflow"))
    clock.seen(status, 2, line("resume", 400.0, **RESUMED))
    assert status.attempts[2].recovery_seconds is None
