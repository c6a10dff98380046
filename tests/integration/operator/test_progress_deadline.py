"""runPolicy.progressDeadlineSeconds on the real control plane: an attempt whose data loader
hangs at step 25 (its metrics endpoint answers on, showing a step that no longer moves) is
ended Stalled once its step has stood still 30 s as the operator's reads saw, its pod stopped
(SIGTERM, then SIGKILL: the hung rank cannot act on it), and the next attempt goes on in the
same precision from the step-20 checkpoint to Succeeded."""

from __future__ import annotations

import pytest

from tests.integration.operator.conftest import Jobs, Operator
from tests.unit.localrun.stall_task import SPEC, stalled_then_retried

pytestmark = pytest.mark.integration


def test_an_attempt_whose_step_stands_still_past_its_deadline_is_stopped_and_retried(
    operator: Operator, jobs: Jobs
) -> None:
    jobs.pvc("ckpt")
    claim = {"persistentVolumeClaim": {"claimName": "ckpt"}}
    jobs.create("hung", {**SPEC, "checkpoint": {**SPEC["checkpoint"], "volume": claim}})
    status = jobs.wait_phase("hung", ("Succeeded", "Failed"), 300)
    stalled_then_retried(status, "rank 0's metrics")
