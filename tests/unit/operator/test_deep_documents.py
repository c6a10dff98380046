"""A body nested deeper than Python's parser reads by default never stops a watch: the operator
decodes what the API server can store, our watches skip what they still cannot read, and the
liveness probe fails while a watch (ours or kopf's) is dead."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from mpjob.controller import documents
from mpjob.controller.liveness import Liveness
from mpjob.controller.watch import FAILING_SECONDS, SILENT_SECONDS, ListWatch, Source, _event
from tests.helpers import wait_for

pytestmark = pytest.mark.unit


def deep(levels: int) -> str:
    return '{"a": ' * levels + "1" + "}" * levels


def test_the_operator_decodes_the_deepest_document_the_api_server_stores() -> None:
    """In a fresh interpreter: the default limit fails on 1,500 levels, as kopf's watch did; after
    allow_deep_documents 10,000 levels (the server's own limit) decode, in a thread too."""
    script = f"""
import json, threading
from mpjob.controller import documents
body = {deep(1500)!r}
try:
    documents.loads(body)
    raise SystemExit("decoded with the default limit")
except documents.Undecodable as exc:
    assert isinstance(exc, ValueError) and "nested deeper" in str(exc), exc
documents.allow_deep_documents()
deepest = '[' * {documents.DEEPEST_DOCUMENT + 2} + ']' * {documents.DEEPEST_DOCUMENT + 2}
events = '{{"type": "ADDED", "object": ' + {deep(documents.DEEPEST_DOCUMENT)!r} + '}}'
assert documents.loads(events)["type"] == "ADDED" and documents.loads(deepest)
done = []
thread = threading.Thread(target=lambda: done.append(json.loads(events)))
thread.start(); thread.join()
assert done, "the thread could not decode it"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_watch_line_too_deep_to_decode_is_skipped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    too_deep = '{"type": "ADDED", "object": ' + deep(sys.getrecursionlimit() + 10) + "}"
    with caplog.at_level(logging.WARNING, logger="mpjob.operator.cache"):
        assert _event(too_deep) is None
    assert "nested deeper than this process decodes" in caplog.text
    assert _event('{"type": "ADDED", "object": {"metadata": {"uid": "u"}}}') == ("ADDED", {"metadata": {"uid": "u"}})


class Response:
    """What the client hands back with _preload_content=False: a listing's data, or watch lines."""

    def __init__(self, data: bytes = b"", lines: list[str] | None = None) -> None:
        self.data, self.lines = data, lines or []

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        for line in self.lines:
            yield (line + "\n").encode()

    def release_conn(self) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.applied: list[tuple[str, dict[str, Any]]] = []

    def relist(self, resource: str, namespace: str | None, objects: list[dict[str, Any]]) -> None:
        pass

    def apply(self, resource: str, kind: str, obj: dict[str, Any]) -> None:
        self.applied.append((kind, obj))


def pod(uid: str, version: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "resourceVersion": version}}


def start(call: Callable[..., Any], sink: Sink) -> tuple[ListWatch, threading.Event]:
    stop = threading.Event()
    watch = ListWatch(Source("pods", "ns", call), cache=sink, synced=threading.Event(), stop=stop)
    watch.start()
    return watch, stop


def test_one_undecodable_event_leaves_the_watch_going() -> None:
    listing = json.dumps({"metadata": {"resourceVersion": "1"}, "items": []}).encode()
    too_deep = '{"type": "ADDED", "object": ' + deep(sys.getrecursionlimit() + 10) + "}"
    events = [json.dumps({"type": "ADDED", "object": pod("a", "2")}), too_deep]
    events.append(json.dumps({"type": "ADDED", "object": pod("b", "3")}))
    calls: list[dict[str, Any]] = []

    def call(*args: Any, **kwargs: Any) -> Response:
        calls.append(kwargs)
        if not kwargs.get("watch"):
            return Response(listing)
        return Response(lines=events if len(calls) == 2 else [])

    sink = Sink()
    watch, stop = start(call, sink)
    try:
        wait_for(lambda: len(calls) >= 3, 60, message="the watch resumed after the bad line")
        assert [obj["metadata"]["uid"] for _, obj in sink.applied] == ["a", "b"]
        assert calls[2]["resource_version"] == "3"  # resumed from the last event, not listed again
        assert watch.dead() is None
    finally:
        stop.set()


def test_a_watch_is_dead_when_it_fails_for_a_minute_or_ends() -> None:
    def refused(*args: Any, **kwargs: Any) -> Response:
        raise ConnectionRefusedError("connection refused")

    watch, stop = start(refused, Sink())
    try:
        wait_for(lambda: watch.failing, 60, message="the first failure")
        assert watch.dead() is None  # failing, but not for long
        later = watch.progressed + FAILING_SECONDS + 1
        assert "mpjob-watch-pods-ns has failed for" in (watch.dead(now=later) or "")
    finally:
        stop.set()
    watch.join(5)
    assert watch.dead() is None  # stopped on purpose is not dead

    idle = ListWatch(Source("pods", "ns", refused), cache=Sink(), synced=threading.Event(), stop=threading.Event())
    assert idle.dead() == "mpjob-watch-pods-ns has ended"  # never ran (or its thread died)


def test_a_watch_that_stays_silent_past_the_servers_timeout_is_dead() -> None:
    stop = threading.Event()
    watch = ListWatch(Source("pods", "ns", lambda *a, **k: None), cache=Sink(), synced=threading.Event(), stop=stop)
    watch.is_alive = lambda: True  # type: ignore[method-assign]  # a thread blocked in a read
    assert watch.dead(now=watch.progressed + SILENT_SECONDS - 1) is None
    assert "silent for" in (watch.dead(now=watch.progressed + SILENT_SECONDS + 1) or "")


def test_liveness_fails_on_a_dead_cache_watch_or_a_lost_kopf_watcher() -> None:
    dead: list[str] = []

    async def scenario() -> list[list[str]]:
        forever = asyncio.Event()
        name = "watcher for mixedprecisionjobs.v1alpha1.mpjob.dev@"
        tasks = [asyncio.create_task(forever.wait(), name=name + ns) for ns in ("a", "b")]
        other = asyncio.create_task(forever.wait(), name="watcher for pods.v1@a")  # not ours: not counted
        liveness = Liveness("mixedprecisionjobs", lambda: list(dead))
        seen = [liveness.problems()]
        dead.append("mpjob-watch-pods-a has ended")
        seen.append(liveness.problems())
        dead.clear()
        tasks[1].cancel()
        await asyncio.sleep(0)
        seen.append(liveness.problems())
        forever.set()
        await asyncio.gather(tasks[0], other)
        return seen

    alive, cache_dead, kopf_lost = asyncio.run(scenario())
    assert alive == []
    assert cache_dead == ["mpjob-watch-pods-a has ended"]
    assert kopf_lost == ["kopf watches mixedprecisionjobs in 1 of the 2 places it did"]
