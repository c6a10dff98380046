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


class Waits(threading.Event):
    """A stop whose waits return at once, recorded; it is set after `most` of them."""

    def __init__(self, most: int) -> None:
        super().__init__()
        self.most, self.waited = most, list[float]()

    def wait(self, timeout: float | None = None) -> bool:
        self.waited.append(float(timeout or 0.0))
        if len(self.waited) >= self.most:
            self.set()
        return self.is_set()


@pytest.mark.parametrize("watched", ["refused", "an ERROR event"])
def test_a_watch_that_keeps_failing_after_each_listing_backs_off_and_is_said_once(
    watched: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An RBAC that grants list but not watch (or a server that ends every watch with an ERROR
    event): each listing works and each watch after it fails. The listings are not asked every
    second, nor is the failure said twice, with a recovery line in between."""
    listings = 0

    def call(*args: Any, **kwargs: Any) -> Response:
        nonlocal listings
        if not kwargs.get("watch"):
            listings += 1
            return Response(json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode())
        if watched == "refused":
            raise refusal(403, "Forbidden", "pods is forbidden: cannot watch")
        return Response(lines=[json.dumps({"type": "ERROR", "object": {"code": 500, "message": "etcd"}})])

    stop = Waits(most=6)
    watch = ListWatch(Source("pods", "ns", call), cache=Sink(), synced=threading.Event(), stop=stop)
    with caplog.at_level(logging.INFO, logger="mpjob.operator.cache"):
        watch.run()  # here, until the sixth wait
    assert stop.waited == [1, 2, 4, 8, 16, 30] and listings == 6
    assert len(caplog.records) == 1, [r.getMessage() for r in caplog.records]
