"""An attempt's Job deleted by hand on the real control plane while its pods run: the operator
creates it again in the same attempt, uncharged, says so in a Warning Event, and the attempt keeps
the start step it began at (docs/walkthrough.md, "Change a running job"). One deleted with
--cascade=orphan leaves its pods running without an owner: the operator deletes them (their
trainer checkpoints on SIGTERM) and goes on once they have stopped, as after any deletion."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.helpers import paced, wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_fault_policy import mlp_spec

pytestmark = pytest.mark.integration

#: At 0.05 s a step, 18 s at least are left once the status shows step 30 (it lags the trainer by
#: a read or two), for the test's change to land while the attempt runs, on a starved machine too.
STEPS = 400


def test_a_running_attempt_s_job_deleted_by_hand_is_created_again_and_said(operator: Operator, jobs: Jobs) -> None:
    first = running_past_step_30(jobs, "hand")
    (ran,) = trainer_states(jobs)
    jobs.batch.delete_namespaced_job("hand-a0", jobs.namespace, propagation_policy="Background")
    first_seconds = (datetime.now(UTC) - ran.running.started_at).total_seconds()  # at least
    wait_for(lambda: created_again(jobs, "hand-a0", first), 120, message="hand-a0 created again")
    (event,) = [e for e in jobs.events("hand", "JobRecreated") if e.reason == "JobRecreated"]
    assert event.type == "Warning" and "attempt 0" in event.message, event.message
    status = jobs.wait_phase("hand", ("Succeeded", "Failed"), 180)
    assert status["phase"] == "Succeeded", status
    (attempt,) = status["attempts"]
    assert (attempt["startStep"], attempt["endStep"], status["step"]) == (0, STEPS, STEPS), attempt
    assert status["attemptCounts"]["started"] == 1 and jobs.attempt_jobs("hand") == ["hand-a0"]
    # Its GPU-seconds are both Jobs' (one GPU a pod; the pods' times are whole seconds).
    (done,) = trainer_states(jobs)
    second_seconds = (done.terminated.finished_at - done.terminated.started_at).total_seconds()
    assert attempt["gpuSeconds"] >= first_seconds + second_seconds - 2, (attempt, first_seconds, second_seconds)
    assert status["cost"]["gpuSeconds"] == attempt["gpuSeconds"]


@pytest.mark.parametrize("operator_down", [False, True], ids=["operator-up", "operator-down"])
def test_pods_a_job_deleted_with_cascade_orphan_left_are_stopped_before_it_is_created_again(
    operator: Operator, jobs: Jobs, operator_down: bool
) -> None:
    """Also when the operator was down as the Job went: the UID its status recorded tells the
    restarted operator the pods left behind are its attempt's."""
    first = running_past_step_30(jobs, "left")
    assert jobs.status("left")["attempts"][0]["jobUid"] == first  # recorded: a restart still knows it
    (orphan,) = jobs.core.list_namespaced_pod(jobs.namespace, label_selector="mpjob.dev/job=left").items
    if operator_down:
        operator.kill()
    jobs.batch.delete_namespaced_job("left-a0", jobs.namespace, propagation_policy="Orphan")  # kubectl --cascade=orphan
    if operator_down:
        wait_for(lambda: not jobs.attempt_jobs("left"), 60, message="left-a0 gone, its children left")
        operator.start()
    wait_for(lambda: created_again(jobs, "left-a0", first), 120, message="left-a0 created again")
    # The pod left behind was deleted by the operator, and had stopped before the new Job was
    # made (no two attempts write checkpoints at once): no trainer of it runs any more.
    still = jobs.core.list_namespaced_pod(jobs.namespace, field_selector=f"metadata.name={orphan.metadata.name}").items
    assert all(p.metadata.uid != orphan.metadata.uid or not running(p) for p in still), still
    wait_for(lambda: not left_pod(jobs, orphan.metadata.uid), 60, message="the pod left behind deleted")
    stopped = [e for e in jobs.events("left", "OrphanedPodsStopped") if e.reason == "OrphanedPodsStopped"]
    assert len(stopped) == 1 and orphan.metadata.name in stopped[0].message, stopped  # said once
    status = jobs.wait_phase("left", ("Succeeded", "Failed"), 180)
    assert status["phase"] == "Succeeded", status  # its Service was the attempt's again: no NameConflict
    (attempt,) = status["attempts"]
    assert (attempt["startStep"], attempt["endStep"], status["step"]) == (0, STEPS, STEPS), attempt
    assert attempt["jobUid"] not in ("", first), attempt
    assert attempt["deletedJobsGpuSeconds"] >= 1, attempt  # the pod left behind ran (and was charged) too
    assert status["attemptCounts"]["started"] == 1 and jobs.attempt_jobs("left") == ["left-a0"]


def running_past_step_30(jobs: Jobs, name: str) -> str:
    """Create job `name` (fp16, STEPS paced steps, a checkpoint every 20) and wait until its
    status shows step 30: the UID of its attempt 0's Job."""
    jobs.pvc("ckpt")
    spec = mlp_spec("ckpt", "fp16", every=20, stepDelay=paced(0.05))
    spec["training"]["steps"] = STEPS
    jobs.create(name, spec)
    jobs.wait_status(name, lambda s: s.get("step", 0) >= 30, 120, "the attempt past step 30")
    return str(jobs.batch.read_namespaced_job(f"{name}-a0", jobs.namespace).metadata.uid)


def created_again(jobs: Jobs, job: str, first: str) -> bool:
    """Whether Job `job` is there again, not the one of UID `first`."""
    found = jobs.batch.list_namespaced_job(jobs.namespace, field_selector=f"metadata.name={job}").items
    return bool(found) and found[0].metadata.uid != first


def running(pod: Any) -> bool:
    return any(c.state.running is not None for c in pod.status.container_statuses or [] if c.name == "trainer")


def left_pod(jobs: Jobs, uid: str) -> bool:
    """Whether the pod of UID `uid` is still there."""
    pods = jobs.core.list_namespaced_pod(jobs.namespace, label_selector="mpjob.dev/job=left").items
    return any(p.metadata.uid == uid for p in pods)


def trainer_states(jobs: Jobs) -> list[Any]:
    """The trainer container's state in each pod of the job's attempt 0."""
    pods = jobs.core.list_namespaced_pod(jobs.namespace, label_selector="mpjob.dev/job=hand").items
    return [c.state for p in pods for c in p.status.container_statuses or [] if c.name == "trainer"]
