"""A list + watch that keeps failing says so once per distinct problem, in one line that names
the resource and namespace and quotes the API server, and once more when it answers again."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from mpjob.controller.watch import GRANT, ListWatch, Source, problem
from tests.helpers import wait_for
from tests.unit.operator.test_deep_documents import Response, Sink

pytestmark = pytest.mark.unit


def refusal(status: int, reason: str, message: str) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "code": status, "reason": reason, "message": message}).encode()
    return exc


def test_a_problem_names_the_resource_the_namespace_and_the_servers_words() -> None:
    jobs = Source("jobs", "team-a", print, group="batch")
    said = problem("listing", jobs, refusal(403, "Forbidden", 'jobs.batch is forbidden:\n  User "u"'))
    assert said == f'listing jobs.batch in namespace team-a: 403 Forbidden: jobs.batch is forbidden: User "u" — {GRANT}'
    pods = Source("pods", None, print)
    assert problem("watching", pods, TimeoutError("read\ntimed out")) == (
        "watching pods in every namespace: TimeoutError: read timed out"
    )
    assert problem("listing", pods, ApiException(status=500, reason="Internal Server Error")) == (
        "listing pods in every namespace: 500 Internal Server Error"
    )


def test_a_repeated_failure_is_said_once_a_new_one_again_and_the_recovery_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answers: list[Any] = [
        refusal(403, "Forbidden", "no"),
        refusal(403, "Forbidden", "no"),
        refusal(500, "Internal Server Error", "etcd"),
    ]
    calls: list[dict[str, Any]] = []

    def call(*args: Any, **kwargs: Any) -> Response:
        calls.append(kwargs)
        if answers:
            raise answers.pop(0)
        if kwargs.get("watch"):
            return Response(lines=[])
        return Response(json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode())

    stop, synced = threading.Event(), threading.Event()
    watch = ListWatch(Source("pods", "ns", call), cache=Sink(), synced=synced, stop=stop)
    with caplog.at_level(logging.INFO, logger="mpjob.operator.cache"):
        watch.start()
        try:
            assert synced.wait(30), "never listed after the failures"
            wait_for(lambda: "answered again" in caplog.text, 10, message="the recovery line")
        finally:
            stop.set()
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(";")[0] for line in lines] == [
        "listing pods in namespace ns: 403 Forbidden: no — " + GRANT,
        "listing pods in namespace ns: 500 Internal Server Error: etcd",
        "pods in namespace ns: answered again after 3 failures",
    ]
    assert not watch.failing
