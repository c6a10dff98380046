"""A running job's spec edited on the real control plane: the attempt running trains on the spec
it was launched with, and the status tells what it did (docs/walkthrough.md, "Change a running
job")."""

from __future__ import annotations

import pytest

from tests.helpers import paced
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_fault_policy import mlp_spec

pytestmark = pytest.mark.integration

#: At 0.05 s a step, 18 s at least are left once the status shows step 30 (it lags the trainer by
#: a read or two), for the test's change to land while the attempt runs, on a starved machine too.
STEPS = 400


def test_steps_lowered_below_the_running_step_leave_the_attempt_s_steps_and_checkpoints_true(
    operator: Operator, jobs: Jobs
) -> None:
    """The attempt trains on to its own end; its steps and last checkpoint are recorded as it
    names them, not held to the lowered end (they once read step 20 with step 160's checkpoint)."""
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", "fp16", every=20, stepDelay=paced(0.05))
    spec["training"]["steps"] = STEPS
    jobs.create("cut", spec)
    jobs.wait_status("cut", lambda s: s.get("step", 0) >= 30, 120, "the attempt past step 30")
    jobs.patch_spec("cut", {"training": {"steps": 20}})
    jobs.wait_status("cut", lambda s: s.get("observedGeneration") == 2, 30, "the edit read")
    status = jobs.wait_phase("cut", ("Succeeded", "Failed"), 180)
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (status["step"], attempt["endStep"], status["totalSteps"]) == (STEPS, STEPS, STEPS)
    checkpoint = status["lastCheckpoint"]
    assert checkpoint["step"] == STEPS and checkpoint["path"].endswith(f"step-{STEPS:09d}"), checkpoint
