"""A job whose spec the models refuse fails once, with the first problem named in a message the
status can hold: a problem names the field and may echo the value it refuses, and both are the
user's (a keepFp32 entry the CRD takes at any length, an unknown field of an object stored
under an older CRD), so the message is cut as every other message in the status."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.workqueue import Retry
from tests.unit.operator.test_api_errors import FakeCluster, counting_creates, events, reconciler  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

LONG = 300_000


@pytest.mark.parametrize(
    ("spec", "starts"),
    [
        ({"precision": {"keepFp32": ["x-" * LONG]}}, "invalid spec: spec.precision.keepFp32"),
        ({"b" * LONG: 1}, "invalid spec: spec.bbbb"),
        ({"task": {"builtin": "gpt", "args": {"a" * LONG: [[[[1]]]]}}}, "invalid spec: spec.task.args.aaaa"),
        # A builtin's argument the trainer would refuse at start, as validate refuses it.
        (
            {"task": {"builtin": "mlp", "args": {"stepDelay": 0.05}}},
            "invalid spec: spec.task.args.stepDelay: expected {fp32|bf16|fp16: seconds",
        ),
        # A rule over the whole spec names its field below spec, once.
        (
            {"workers": 2, "elastic": {"minWorkers": 3}},
            "invalid spec: spec.elastic.minWorkers: elastic.minWorkers must be",
        ),
        # A spec no trainer process can be started with (its launch is one environment variable).
        (
            {"task": {"module": "a.b:c", "args": {"vocab": ["w" * 64] * 3000}}},
            "invalid spec: spec.task.args.vocab: the spec is ",
        ),
    ],
    ids=["refused-value", "unknown-field", "deep-argument", "builtin-argument", "spec-wide-rule", "too-large"],
)
@pytest.mark.usefixtures("events")
def test_an_invalid_spec_fails_the_job_with_a_bounded_message(spec: dict[str, Any], starts: str) -> None:
    cluster = FakeCluster()
    cluster.body["spec"].update(spec)
    reconciler(cluster).handle(("ns", "j"), False)
    status = cluster.body["status"]
    assert status["phase"] == "Failed" and status["message"].startswith(starts)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and failed["message"] == status["message"]
    assert len(status["message"]) <= 1024


def test_an_invalid_spec_is_told_by_one_warning_event(events: list[tuple[str, str]]) -> None:  # noqa: F811
    """`kubectl describe` and `kubectl get events` show why the job failed, as for every other
    failure: one Warning Event `Failed` with the status's message, not again on the next reconcile."""
    cluster = FakeCluster()
    cluster.body["spec"].update({"task": {"builtin": "gpt", "args": {"nLayer": "x"}}})
    made = reconciler(cluster)
    made.handle(("ns", "j"), False)
    made.handle(("ns", "j"), False)
    assert events == [("Failed", cluster.body["status"]["message"])]
    assert events[0][1].startswith("invalid spec: spec.task.args.nLayer")


@pytest.mark.parametrize("refused_first", [False, True], ids=["deleted", "delete-refused-first"])
def test_a_running_job_edited_to_an_invalid_spec_stops_its_attempt(
    events: list[tuple[str, str]],  # noqa: F811
    refused_first: bool,
) -> None:
    """A spec edit the CRD takes but the models refuse fails a job whose attempt runs: the
    attempt ends with the job (its Job, ours by UID, is deleted: its trainers stop and
    checkpoint on SIGTERM), not left running on its GPUs under a status that says Failed. A
    delete refused for now (a 500) is asked again at the failed job's next reconcile; once done,
    never again."""
    cluster, asked = FakeCluster(), []

    def delete_job(namespace: str, job: str, *, index: int, uid: str) -> bool:
        asked.append((f"{job}-a{index}", uid))
        if refused_first and len(asked) == 1:
            raise ApiException(status=500, reason="etcdserver: request timed out")
        cluster.deleted.append((f"{job}-a{index}", uid))
        return True

    cluster.create_job = counting_creates(cluster)  # type: ignore[method-assign]
    cluster.delete_job = delete_job  # type: ignore[method-assign]
    made = reconciler(cluster)
    made.handle(("ns", "j"), False)
    assert cluster.body["status"]["attempts"][0]["jobUid"] == "job-uid"
    cluster.body["spec"]["task"] = {"builtin": "mlp", "args": {"stepDelay": 0.05}}
    cluster.body["metadata"]["generation"] = 2
    made.bodies.offer(("ns", "j"), cluster.edited())
    if refused_first:
        with pytest.raises(Retry):
            made.handle(("ns", "j"), False)
        assert cluster.deleted == [] and cluster.body["status"]["phase"] == "Failed"
        made.handle(("ns", "j"), False)  # the retry: the job is Failed, its Job still there
    else:
        made.handle(("ns", "j"), False)
    status = cluster.body["status"]
    assert status["phase"] == "Failed" and status["message"].startswith("invalid spec: spec.task.args.stepDelay")
    assert cluster.deleted == [("j-a0", "job-uid")]
    attempt = status["attempts"][0]
    assert attempt["finishTime"] and attempt["reason"] == "InvalidSpec"
    made.handle(("ns", "j"), False)  # once
    assert cluster.deleted == [("j-a0", "job-uid")]
    assert [r for r, _ in events].count("Failed") == 1
