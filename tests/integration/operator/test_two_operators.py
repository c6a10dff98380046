"""Two operators acting on the same jobs at once (a second one started by hand, a standby that
took over while the active one only stalled): the status is the operators' memory, so a status
planned from an older read of the job must never overwrite a newer one. Every status write holds
only while the job is at the resourceVersion it was planned from (a 409 Conflict otherwise, and
the reconcile is retried from a new read); a plan's Events are posted only after its write holds,
so each attempt's start and end is told once, however many operators race for it. A Job made for
an attempt that had ended meanwhile (an operator that stalled before making it) is deleted."""

from __future__ import annotations

import re
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from mpjob.builders.attempt import attempt_job
from mpjob.controller.actions import write_status
from mpjob.controller.cluster import Cluster
from mpjob.planning.backoff import ENV_BASE
from mpjob.planning.planner import StartAttempt
from mpjob_contract import api
from mpjob_contract.api import MixedPrecisionJobSpec, MixedPrecisionJobStatus
from tests.helpers import wait_for
from tests.integration.operator.conftest import Jobs, Operator
from tests.integration.operator.test_cannot_start import command_spec

pytestmark = pytest.mark.integration

CONFLICT = 409


def attempts(*indices: int) -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {"phase": "Running", "attempts": [{"index": i, "precision": "fp32"} for i in indices]}
    )


def test_a_status_planned_from_an_older_read_is_refused_and_the_newer_one_kept(
    api_client: client.ApiClient, namespace: str, crd_installed: None, jobs: Jobs
) -> None:
    jobs.create("raced", command_spec([sys.executable, "-c", "pass"]))
    cluster = Cluster(custom=client.CustomObjectsApi(api_client), batch=None, core=None)
    stale, fresh = cluster.read_job(namespace, "raced"), cluster.read_job(namespace, "raced")
    assert stale is not None and fresh is not None
    write_status(cluster, fresh, {}, attempts(0, 1))  # the other operator: attempt 1 recorded
    assert fresh["metadata"]["resourceVersion"] != stale["metadata"]["resourceVersion"], "the write's version kept"
    write_status(cluster, fresh, attempts(0, 1).to_api(), attempts(0, 1, 2))  # its next write chains on it

    with pytest.raises(ApiException) as refused:  # this one read before either write: attempt 0 only
        write_status(cluster, stale, {}, attempts(0))
    assert refused.value.status == CONFLICT
    assert [a["index"] for a in jobs.status("raced")["attempts"]] == [0, 1, 2], "no attempt forgotten"


def test_two_standalone_operators_tell_each_attempt_once_and_make_one_job_for_it(
    kubeconfig: str, namespace: str, crd_installed: None, jobs: Jobs, tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(1.5)\nraise SystemExit(1)\n")  # InfraError, retried once
    ops = [Operator(kubeconfig, namespace, tmp_path / f"operator{i}.log", env={ENV_BASE: "0"}) for i in range(2)]
    for op in ops:
        op.start()
    try:
        jobs.create("twice", command_spec([sys.executable, str(script)]))
        status = jobs.wait_phase("twice", "Failed", 240)
        assert [(a["index"], a["reason"]) for a in status["attempts"]] == [(0, "InfraError"), (1, "InfraError")]
        assert jobs.attempt_jobs("twice") == ["twice-a0", "twice-a1"]
        jobs.events("twice", "Failed")
    finally:
        for op in ops:  # both have seen every change, and posted what they would, once stopped
            op.stop()
    told = told_by_attempt(jobs, "twice", "Failed")
    assert told == {**each_attempt_once(0, 1), ("Failed", None): 1}, told


@pytest.mark.parametrize("recorded", [True, False], ids=["another-job-recorded", "none-recorded"])
def test_a_job_made_for_an_attempt_another_operator_ended_is_deleted_once(
    operator: Operator, jobs: Jobs, tmp_path: Path, recorded: bool
) -> None:
    """An operator that recorded "attempt 0 starts", stalled before making its Job and woke after
    attempt 0 had ended (its Job retired or deleted) makes the Job then: mimicked by hand, a Job of
    attempt 0's name controlled by the MixedPrecisionJob. The operator deletes it by its UID, says
    so once, and never records it as attempt 0's Job: where the entry records another Job, and
    where it records none (ended before any Job of it was made), by the API server's own
    creationTimestamp of the late Job, after the entry's finishTime."""
    script = tmp_path / "train.py"
    script.write_text("import time\ntime.sleep(1.5)\nraise SystemExit(1)\n")
    jobs.create("stray", command_spec([sys.executable, str(script)]))
    status = jobs.wait_phase("stray", "Failed", 240)
    jobs.batch.delete_namespaced_job("stray-a0", jobs.namespace, propagation_policy="Background")
    wait_for(lambda: "stray-a0" not in jobs.attempt_jobs("stray"), 60, message="stray-a0 gone")
    if not recorded:  # as if attempt 0 ended before any Job of it was made
        entries = [{k: v for k, v in a.items() if k != "jobUid"} for a in status["attempts"]]
        patch = {"status": {"attempts": entries}}
        jobs.custom.patch_namespaced_custom_object_status(
            api.GROUP, api.VERSION, jobs.namespace, api.PLURAL, "stray", patch
        )
    ended = datetime.fromisoformat(status["attempts"][0]["finishTime"])
    wait_for(lambda: datetime.now(UTC) >= ended + timedelta(seconds=1), 5, message="a second past attempt 0's end")
    late = made_late(jobs, "stray")
    wait_for(lambda: "stray-a0" not in jobs.attempt_jobs("stray"), 60, message="the stalled operator's Job deleted")
    (said,) = [e for e in jobs.events("stray", "StrayJobDeleted") if e.reason == "StrayJobDeleted"]
    assert said.type == "Warning" and late in said.message and (said.count or 1) == 1, said.message
    kept = status["attempts"][0]["jobUid"] if recorded else None
    assert jobs.status("stray")["attempts"][0].get("jobUid") == kept, "never recorded as attempt 0's Job"
    told = told_by_attempt(jobs, "stray", "StrayJobDeleted")  # two attempts (retried once): each told once
    assert {k: n for k, n in told.items() if k[0].startswith("Attempt")} == each_attempt_once(0, 1), told


def told_by_attempt(jobs: Jobs, name: str, *reasons: str) -> Counter[tuple[str, int | None]]:
    """How many times each Event about this test's own job `name` (by its UID) was told, by
    reason and the attempt its message names (None: no attempt), once `reasons` are among them;
    an Event the API server aggregated counts as many times as its `count`."""
    uid = jobs.get(name)["metadata"]["uid"]
    told: Counter[tuple[str, int | None]] = Counter()
    for event in jobs.events(name, *reasons):
        if event.involved_object.uid == uid:
            named = re.match(r"attempt (\d+)", event.message or "")
            told[event.reason, int(named.group(1)) if named else None] += event.count or 1
    return told


def each_attempt_once(*indices: int) -> dict[tuple[str, int | None], int]:
    return {(reason, i): 1 for i in indices for reason in ("AttemptStarted", "AttemptEnded")}


def made_late(jobs: Jobs, name: str) -> str:
    """Attempt 0's Job of the MixedPrecisionJob `name`, made now as a stalled operator would (its
    pods never run here: what is tested is whose Job it is); its UID."""
    body = jobs.get(name)
    spec = MixedPrecisionJobSpec.model_validate(body["spec"])
    made = attempt_job(
        job=name, namespace=jobs.namespace, uid=body["metadata"]["uid"], spec=spec,
        start=StartAttempt(0, "fp32", None, 0), image="mpjob-trainer:stalled",
    )  # fmt: skip
    made["spec"]["suspend"] = True
    made["metadata"]["ownerReferences"] = [
        {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": name, "uid": body["metadata"]["uid"],
         "controller": True, "blockOwnerDeletion": True},
    ]  # fmt: skip
    return str(jobs.batch.create_namespaced_job(jobs.namespace, made).metadata.uid)
