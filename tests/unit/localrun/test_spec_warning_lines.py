"""`mpjob run` names a setting that never applies once, before the first attempt, in the same
words as `mpjob validate` (mpjob_contract.spec_warnings), and runs the job all the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import mpjob_run_json
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_run_names_a_dead_setting_before_the_first_attempt(tmp_path: Path) -> None:
    job = tiny_job()  # two steps, checkpoint.everySteps 200 by default
    events, report, _ = mpjob_run_json(tmp_path, job)
    assert report["phase"] == "Succeeded", report
    said = [e for e in events if e["event"] == "info" and "warning: spec." in e["message"]]  # not the node's F6
    assert [(e["field"], e["message"]) for e in said] == [
        (
            "spec.checkpoint.everySteps",
            f"{tmp_path / 'job.yaml'}: warning: spec.checkpoint.everySteps: checkpoint.everySteps=200 is more than "
            "training.steps=2: no checkpoint before the last step (but one a stop writes), so a fault starts the "
            "next attempt over from step 0",
        )
    ]
    assert events.index(said[0]) < next(i for i, e in enumerate(events) if e["event"] == "attemptStarted")
