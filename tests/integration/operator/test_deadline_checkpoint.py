"""runPolicy.activeDeadlineSeconds on the real control plane: a running attempt past it is ended
at once (the job Failed, DeadlineExceeded, its Job deleted), its trainer checkpoints on SIGTERM,
and once its pod has stopped that checkpoint is the job's lastCheckpoint, its step the job's step
and the attempt's endStep (docs/fault-policy.md): a user who raises the deadline and resumes, or
reads the status for the newest checkpoint, is told of it."""

from __future__ import annotations

import pytest

from tests.helpers import paced, wait_for
from tests.integration.operator.conftest import UNTIL_STOPPED, Jobs, Operator
from tests.integration.operator.test_fault_policy import mlp_spec

pytestmark = pytest.mark.integration


def test_a_job_past_its_deadline_records_the_checkpoint_its_trainer_wrote_on_sigterm(
    operator: Operator, jobs: Jobs, namespace: str, kubeconfig: str
) -> None:
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", "fp16", every=100_000, stepDelay=paced(0.05))  # no periodic checkpoint
    spec["training"]["steps"] = UNTIL_STOPPED
    jobs.create("late", spec)
    jobs.wait_status("late", lambda s: s.get("step", 0) >= 20, 120, "the attempt past step 20")
    jobs.patch_spec("late", {"runPolicy": {"activeDeadlineSeconds": 1}})  # long passed: it ends now
    ended = jobs.wait_phase("late", "Failed", 60)
    assert ended["attempts"][0]["reason"] == "DeadlineExceeded", ended
    pods = jobs.core.list_namespaced_pod
    wait_for(lambda: not pods(namespace, label_selector="mpjob.dev/job=late").items, 90, message="its pod gone")
    written = sorted(jobs.checkpoints(kubeconfig, "ckpt", "late").glob("step-*/manifest.json"))
    assert len(written) == 1, written  # the one written on SIGTERM
    step = int(written[0].parent.name.split("-")[1])
    status = jobs.wait_status(
        "late", lambda s: (s.get("lastCheckpoint") or {}).get("step") == step, 30, f"lastCheckpoint at step {step}"
    )
    (attempt,) = status["attempts"]
    assert (status["phase"], attempt["endStep"], status["step"]) == ("Failed", step, step), status
    assert step >= 20 and status["lastCheckpoint"]["path"].endswith(written[0].parent.name), status
