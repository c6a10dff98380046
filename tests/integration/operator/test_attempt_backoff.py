"""The wait before an attempt that retries a failure as it was, on the real control plane: after
an InfraError the next attempt is recorded at once, its Running condition False, reason
BackingOff, saying until when (and an Event once), and its Job is made only once the wait is
over; an operator killed during the wait and started again reads the wait from the status: it
neither makes the Job early nor forgets the attempt (one Job for it, made after the wait, and one
AttemptStarted Event for it, posted then)."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from mpjob.planning.backoff import ENV_BASE
from mpjob.planning.status import read_stamp
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_cannot_start import command_spec

pytestmark = pytest.mark.integration

#: The first wait, for this test's operators: long enough for a restart to fall inside it.
BASE_SECONDS = 8
STARTING = "waiting for the first listing"


def backing_off(status: dict[str, Any]) -> dict[str, Any] | None:
    """The Running condition while the newest attempt waits out its backoff."""
    running = next((c for c in status.get("conditions", []) if c["type"] == "Running"), None)
    return running if running is not None and running["reason"] == "BackingOff" else None


def test_an_attempt_after_an_infra_error_waits_its_backoff_across_an_operator_restart(
    kubeconfig: str, namespace: str, crd_installed: None, jobs: Jobs, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import mpjob_no_such_module\n")  # its rank cannot start: InfraError
    log = tmp_path / "operator.log"
    op = Operator(kubeconfig, namespace, log, env={ENV_BASE: str(BASE_SECONDS)})
    op.start()
    try:
        jobs.create("retried", command_spec([sys.executable, str(script)]))
        waiting = jobs.wait_status("retried", lambda s: backing_off(s) is not None, 180, "attempt 1 backing off")
        jobs.events("retried", "BackingOff")  # posted after the status write: a kill before it loses it (said once)
        op.kill()  # during the wait: what it waits for is in the status only
        running = backing_off(waiting)
        assert running is not None and running["status"] == "False", waiting
        said = re.search(rf"attempt 1 starts in {BASE_SECONDS}s, at (\S+) \(a first failure", running["message"])
        assert said is not None and running["message"].startswith("attempt 0 failed (InfraError: "), running
        until = read_stamp(said.group(1))
        assert [(a["index"], a.get("reason")) for a in waiting["attempts"]] == [(0, "InfraError"), (1, None)]
        assert jobs.attempt_jobs("retried") == ["retried-a0"]
        op.start()
        wait_for(lambda: log.read_text().count(STARTING) == 2, 60, message="the operator started again")
        assert datetime.now(UTC) < until, f"the operator started again after the wait ({until}): lengthen it"
        ended = jobs.wait_phase("retried", ("Succeeded", "Failed"), 180)
    finally:
        op.stop()
    # Its second attempt failed as the first did: the job ends Failed after two, as without a wait.
    assert ended["phase"] == "Failed" and [a["index"] for a in ended["attempts"]] == [0, 1], ended
    assert jobs.attempt_jobs("retried") == ["retried-a0", "retried-a1"]
    made = jobs.batch.read_namespaced_job("retried-a1", namespace).metadata.creation_timestamp
    assert made >= until, (made, until)
    assert read_stamp(ended["attempts"][1]["startTime"]) >= until, ended["attempts"][1]
    told = [e for e in jobs.events("retried", "BackingOff") if e.reason == "BackingOff"]
    assert [e.message for e in told] == [running["message"]] and (told[0].count or 1) == 1, told
    # Attempt 1 is said started once, when its Job was made after the wait, not when it was recorded.
    started = [e for e in jobs.events("retried", "AttemptStarted") if e.reason == "AttemptStarted"]
    posted = sorted((e.message.split(",")[0], e.count or 1, e.first_timestamp or e.event_time) for e in started)
    assert [(m.rsplit(" in ", 1)[0], n) for m, n, _ in posted] == [("attempt 0", 1), ("attempt 1", 1)], posted
    assert posted[1][2] >= until, (posted, until)
