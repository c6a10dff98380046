"""The operator's profile asks against the trainer's real control route: each ask carries the
attempt's profile token, which only an operator holding the same key derives; answers are kept
by the job's UID, so a job created again under the same name never gets the old one's answer;
a trainer busy with another capture answers 409 and the entry simply waits."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry

from mpjob.builders.attempt import attempt_job
from mpjob.builders.profile_token import job_profile_secret, job_token
from mpjob.controller import profiles
from mpjob.controller.cache import Observed
from mpjob.controller.cluster import Cluster
from mpjob.controller.profiles import ProfileRequests
from mpjob.planning.planner import StartAttempt
from mpjob.planning.profiles import ProfileAsk
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.tracking import PROFILE_TOKEN_ENV, ProfileAnswer, ProfileStatus
from mpjob_trainer import control

pytestmark = pytest.mark.unit

KEY = b"k" * 32
SPEC = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "mlp"}, "training": {"steps": 10}})


class StatusWrites:
    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_status(
        self, namespace: str, name: str, status: dict[str, Any], *, resource_version: str | None = None
    ) -> None:
        self.patches.append(status)


def trainer(token: str, busy: bool = False) -> int:
    """A trainer's metrics port holding `token`: answers Capturing (409 when `busy`)."""

    def ask(profile_id: int, steps: int) -> ProfileAnswer | None:
        return None if busy else ProfileAnswer(id=profile_id, state="Capturing", steps=steps)

    return control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), ask, token))


def asked(requests: ProfileRequests, uid: str) -> ProfileAnswer | None:
    requests._ask(("ns", "job"), uid, ProfileAsk(id=1, steps=5, attempt=1), "127.0.0.1")
    return requests._answers.get(uid)


def test_only_the_operator_that_holds_the_key_is_answered() -> None:
    port = trainer(job_token(KEY, uid="uid-1"))
    answered = asked(ProfileRequests(StatusWrites(), 2.0, KEY, port=port), "uid-1")  # type: ignore[arg-type]
    assert answered is not None and answered.state == "Capturing"
    another_key = asked(ProfileRequests(StatusWrites(), 2.0, b"another key", port=port), "uid-1")  # type: ignore[arg-type]
    other_job = trainer(job_token(KEY, uid="uid-2"))
    other = asked(ProfileRequests(StatusWrites(), 2.0, KEY, port=other_job), "uid-1")  # type: ignore[arg-type]
    assert [a.state if a else None for a in (another_key, other)] == ["Refused", "Refused"]  # 401: nothing captured


def test_a_busy_trainer_is_asked_again_later() -> None:
    port = trainer(job_token(KEY, uid="uid-1"), busy=True)
    requests = ProfileRequests(StatusWrites(), 2.0, KEY, port=port)  # type: ignore[arg-type]
    assert asked(requests, "uid-1") is None and not requests._busy


def test_answers_are_kept_by_the_jobs_uid_not_its_name() -> None:
    port = trainer(job_token(KEY, uid="uid-1"))
    writes = StatusWrites()
    requests = ProfileRequests(writes, 2.0, KEY, port=port)  # type: ignore[arg-type]
    assert asked(requests, "uid-1") is not None
    entry = ProfileStatus(id=1, request="5", steps=5, attempt=1, state="Requested", path="p")
    attempts = [AttemptStatus(index=0, precision="fp16"), AttemptStatus(index=1, precision="bf16")]
    status = MixedPrecisionJobStatus(phase="Running", attempt=1, attempts=attempts, profiles=[entry])
    body = {
        "metadata": {"namespace": "ns", "name": "job", "uid": "uid-2", "annotations": {"mpjob.dev/profile-steps": "5"}}
    }
    nothing = Observed({}, frozenset(), {}, {})
    requests.reconcile(body, SPEC, status.model_copy(deep=True), nothing)  # the same name, created again
    assert writes.patches == [] and "uid-1" in requests._answers
    body["metadata"]["uid"] = "uid-1"
    requests.reconcile(body, SPEC, status.model_copy(deep=True), nothing)
    assert "uid-1" not in requests._answers and [p["profiles"][0]["state"] for p in writes.patches] == ["Capturing"]


def test_the_token_reaches_the_pods_only_through_the_jobs_one_secret() -> None:
    """Every attempt's pods name the job's one Secret (the operator cannot delete Secrets: one an
    attempt made would outlive the attempt's pruned Job, Service and NetworkPolicy)."""
    token = job_token(KEY, uid="uid-1")
    refs = []
    for index in (0, 1, 7):
        start = StartAttempt(index=index, precision="bf16", start_step=0, resume_from=None)
        job = attempt_job(job="job", namespace="ns", uid="uid-1", spec=SPEC, start=start, image="img")
        assert token not in str(job)
        (env,) = [e for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == PROFILE_TOKEN_ENV]
        refs.append(env["valueFrom"]["secretKeyRef"])
    secret = job_profile_secret("job", "ns", {"mpjob.dev/job": "job"}, token)
    assert {r["name"] for r in refs} == {secret["metadata"]["name"]} == {"job-profile"}
    assert all(r["key"] in secret["data"] for r in refs)
    assert job_token(KEY, uid="uid-2") != token == job_token(KEY, uid="uid-1")


def test_a_bucket_jobs_profile_is_recorded_in_its_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(profiles.kopf, "event", lambda *a, **k: None)
    s3 = {"bucket": "ckpt", "prefix": "runs", "endpoint": "http://s3.test:7070"}
    spec = SPEC.model_validate({**SPEC.to_api(), "checkpoint": {"storage": {"s3": s3}}})
    attempts = [AttemptStatus(index=0, precision="bf16")]
    status = MixedPrecisionJobStatus(phase="Running", attempt=0, attempts=attempts)
    body = {
        "metadata": {"namespace": "ns", "name": "job", "uid": "uid-1", "annotations": {"mpjob.dev/profile-steps": "5"}}
    }
    writes = StatusWrites()
    ProfileRequests(writes, 2.0, KEY).reconcile(body, spec, status, Observed({}, frozenset(), {}, {}))  # type: ignore[arg-type]
    assert writes.patches[0]["profiles"][0]["path"] == "s3://ckpt/runs/ns/job/uid-1/profiles/p1/trace.json.gz"


@pytest.mark.parametrize(("status", "raises"), [(409, False), (403, False), (500, True)])
def test_a_profile_secret_that_exists_or_is_refused_never_stops_the_attempt(status: int, raises: bool) -> None:
    class Core:
        def create_namespaced_secret(self, *args: Any, **kwargs: Any) -> None:
            raise ApiException(status=status, reason="no")

    meta = {"namespace": "ns", "name": "job", "uid": "uid-1"}
    owner: dict[str, Any] = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": meta}
    secret = job_profile_secret("job", "ns", {}, "t0ken")
    cluster = Cluster(custom=None, batch=None, core=Core())
    if raises:
        with pytest.raises(ApiException):
            cluster.create_secret(secret, owner=owner)
    else:
        cluster.create_secret(secret, owner=owner)  # left as it is / logged: the attempt runs
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(("token", "code"), [("another job's token", 401), ("", 403)])
def test_a_profile_rank_0_refuses_for_its_token_is_recorded_refused(token: str, code: int) -> None:
    port = trainer(token)  # pods holding another token (a Secret not the job's), or none at all
    writes = StatusWrites()
    requests = ProfileRequests(writes, 2.0, KEY, port=port)  # type: ignore[arg-type]
    answer = asked(requests, "uid-1")
    assert answer is not None and answer.state == "Refused" and str(code) in (answer.message or "")
    entry = ProfileStatus(id=1, request="5", steps=5, attempt=1, state="Requested", path="p")
    status = MixedPrecisionJobStatus(
        phase="Running", attempt=1, attempts=[AttemptStatus(index=1, precision="bf16")], profiles=[entry]
    )
    meta = {"namespace": "ns", "name": "job", "uid": "uid-1", "annotations": {"mpjob.dev/profile-steps": "5"}}
    requests.reconcile({"metadata": meta}, SPEC, status, Observed({}, frozenset(), {}, {}))
    (written,) = writes.patches[0]["profiles"]
    assert written["state"] == "Refused" and written["finishTime"]  # final: never asked again
