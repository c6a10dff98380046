"""Each attempt's launch names the Job every earlier attempt the status holds ran in (its lineage),
and each trainer pod is told its own Job's UID: a stray Job of an ended attempt (made by an
operator that stalled, never the one the status records) writes checkpoints that later attempts
do not resume from (the trainer's checkpoint.lineage)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from mpjob.builders.attempt import JOB_UID_LABEL, attempt_job
from mpjob.controller.actions import Actions
from mpjob.controller.cache import NOTHING_SEEN, ChildCache
from mpjob.controller.config import OperatorConfig
from mpjob.planning import history
from mpjob.planning import status as st
from mpjob.planning.plan import Plan
from mpjob.planning.planner import StartAttempt
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.environment import ATTEMPT_JOB_ENV
from mpjob_contract.launch import LAUNCH_ENV, AttemptLaunch
from mpjob_contract.status import MAX_FORMER_JOBS
from tests.unit.operator.test_api_errors import FakeCluster
from tests.unit.operator.test_stray_jobs import at

pytestmark = pytest.mark.unit


def _ended(index: int, uid: str | None, *, in_place: bool = False) -> dict[str, Any]:
    entry = {"index": index, "precision": "fp16", "startTime": at(9), "finishTime": at(8), "reason": "Preempted"}
    return entry | ({"jobUid": uid} if uid else {}) | ({"inPlace": True} if in_place else {})


def _status() -> MixedPrecisionJobStatus:
    """Attempts 0 (Job job-0), 1 (in place, in job-0), 2 (job-2) and 3 (no Job recorded) ended; 4 runs."""
    attempts = [_ended(0, "job-0"), _ended(1, None, in_place=True), _ended(2, "job-2"), _ended(3, None)]
    current = {"index": 4, "precision": "bf16", "startTime": at(7), "jobUid": "job-4"}
    return MixedPrecisionJobStatus.model_validate({"phase": "Running", "attempt": 4, "attempts": [*attempts, current]})


def test_the_lineage_is_the_job_each_earlier_attempt_ran_in() -> None:
    status = _status()
    assert history.lineage(status, 4) == {0: ["job-0"], 1: ["job-0"], 2: ["job-2"], 3: []}
    assert history.lineage(status, 2) == {0: ["job-0"], 1: ["job-0"]}
    assert history.lineage(status, 0) == {}


def _launch(job: dict[str, Any]) -> tuple[AttemptLaunch, dict[str, Any]]:
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    return AttemptLaunch.model_validate_json(env[LAUNCH_ENV]["value"]), env


def test_the_attempts_pods_carry_its_lineage_and_their_own_jobs_uid() -> None:
    spec = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}})
    start = StartAttempt(index=2, precision="bf16", resume_from=None, start_step=200)
    made = attempt_job(
        job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="i", lineage={0: ["a"], 1: []}
    )
    launch, env = _launch(made)
    assert launch.lineage == {0: ["a"], 1: []}
    assert env[ATTEMPT_JOB_ENV]["valueFrom"]["fieldRef"]["fieldPath"] == f"metadata.labels['{JOB_UID_LABEL}']"
    unjudged, _ = _launch(attempt_job(job="gpt", namespace="ml", uid="u-1", spec=spec, start=start, image="i"))
    assert unjudged.lineage is None


def test_the_operator_makes_an_attempts_job_with_the_status_lineage() -> None:
    cluster, made = FakeCluster(), []

    def create_job(job: dict[str, Any], *, owner: dict[str, Any]) -> dict[str, Any]:
        made.append(job)
        return {**job, "metadata": {**job["metadata"], "uid": "job-5", "ownerReferences": []}}

    cluster.create_job = create_job  # type: ignore[method-assign]
    status = _status()
    status.attempts[-1].finish_time, status.attempts[-1].reason = at(6), "Preempted"
    status.attempts.append(status.attempts[-1].model_copy(update={"index": 5, "finish_time": None, "job_uid": None}))
    spec = MixedPrecisionJobSpec.model_validate(cluster.body["spec"])
    actions = Actions(OperatorConfig(), cluster, ChildCache(lambda key: None))  # type: ignore[arg-type]
    plan = Plan(status=copy.deepcopy(status), create=[StartAttempt(5, "bf16", None, 0)])
    actions.apply(cluster.body, spec, plan, seen=NOTHING_SEEN)
    launch, _ = _launch(made[0])
    assert launch.attempt == 5 and launch.lineage == {0: ["job-0"], 1: ["job-0"], 2: ["job-2"], 3: [], 4: ["job-4"]}


def test_a_job_made_again_for_a_running_attempt_stays_of_its_lineage() -> None:
    """Attempt 4's Job deleted while it ran, made again: the entry records the new one and keeps the
    one before (its trainers' checkpoints are attempt 4's), the newest MAX_FORMER_JOBS of them."""
    status = _status()
    assert st.record_job_uids(status, {4: "job-4-again"})
    entry = status.attempts[-1]
    assert (entry.job_uid, entry.former_job_uids) == ("job-4-again", ["job-4"])
    assert history.lineage(status, 5)[4] == ["job-4", "job-4-again"]
    assert not st.record_job_uids(status, {4: "job-4-again"})  # the same Job: nothing moves
    for made in range(MAX_FORMER_JOBS + 2):
        st.record_job_uids(status, {4: f"job-4-{made}"})
    assert entry.former_job_uids is not None and len(entry.former_job_uids) == MAX_FORMER_JOBS
    assert entry.former_job_uids[-1] == f"job-4-{MAX_FORMER_JOBS}" and entry.job_uid == f"job-4-{MAX_FORMER_JOBS + 1}"
    launch = AttemptLaunch.model_validate(
        {
            "jobName": "j",
            "precision": "fp16",
            "attempt": 5,
            "lineage": history.lineage(status, 5),
            "spec": {"task": {"builtin": "gpt"}},
        }
    )
    assert launch.lineage is not None and len(launch.lineage[4]) == MAX_FORMER_JOBS + 1
