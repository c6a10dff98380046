"""The operator's work queue: one handler per key at a time, nothing lost, changes before ticks."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

import pytest

from mpjob.controller.workqueue import Retry, WorkQueue
from tests.helpers import wait_for

pytestmark = pytest.mark.unit


class Recorder:
    def __init__(self, gate: threading.Event | None = None) -> None:
        self.calls: list[tuple[Hashable, bool]] = []
        self.gate = gate
        self.running: set[Hashable] = set()
        self.overlaps = 0
        self.lock = threading.Lock()

    def __call__(self, key: Hashable, tick: bool) -> None:
        with self.lock:
            if key in self.running:
                self.overlaps += 1
            self.running.add(key)
        if self.gate is not None:
            self.gate.wait(60)  # the test opens it; a starved one may take seconds
        with self.lock:
            self.running.discard(key)
            self.calls.append((key, tick))


def holding(first: Hashable, workers: int) -> tuple[WorkQueue, Recorder, threading.Event]:
    """A queue whose handler holds `first` until the returned gate is set."""
    gate = threading.Event()
    rec = Recorder(gate)
    queue = WorkQueue(rec, workers=workers)
    queue.add(first)
    wait_for(lambda: first in rec.running, 60, 0.01, f"{first} running")
    return queue, rec, gate


def test_a_key_added_many_times_while_queued_is_handled_once() -> None:
    queue, rec, gate = holding("busy", workers=1)  # holds the only worker
    for _ in range(50):
        queue.add("a")
    gate.set()
    wait_for(lambda: len(rec.calls) == 2, 60, 0.01, "both handled")
    time.sleep(0.1)  # nothing more may come
    assert rec.calls == [("busy", False), ("a", False)]
    queue.close()


def test_a_key_added_while_handled_is_handled_again_after_never_at_once() -> None:
    queue, rec, gate = holding("a", workers=4)
    queue.add("a")
    queue.add("a", tick=True)
    gate.set()
    wait_for(lambda: len(rec.calls) == 2, 60, 0.01, "a handled twice")
    assert rec.overlaps == 0
    assert rec.calls == [("a", False), ("a", False)]  # a change and a tick fold into a change
    queue.close()


def test_changes_go_before_ticks() -> None:
    queue, rec, gate = holding("busy", workers=1)
    queue.add("t1", tick=True)
    queue.add("t2", tick=True)
    queue.add("c1")
    queue.add("t2")  # a change upgrades a queued tick
    gate.set()
    wait_for(lambda: len(rec.calls) == 4, 60, 0.01, "all handled")
    assert rec.calls[1:] == [("c1", False), ("t2", False), ("t1", True)]
    queue.close()


def test_a_failed_handler_is_retried_after_its_delay_and_keeps_its_worker() -> None:
    attempts: list[float] = []

    def handle(key: Hashable, tick: bool) -> None:
        attempts.append(time.monotonic())
        if key == "boom":
            raise RuntimeError("a bug")
        if len(attempts) < 3:
            raise Retry(0.2)

    queue = WorkQueue(handle, workers=1)
    queue.add("flaky")
    wait_for(lambda: len(attempts) == 3, 60, 0.01, "two retries")
    assert attempts[1] - attempts[0] >= 0.2
    queue.add("boom")
    queue.add("after")
    wait_for(lambda: len(attempts) == 5, 60, 0.01, "the worker survived the bug")
    queue.close()


def test_a_waiting_retry_never_swallows_the_wakeup_meant_for_a_worker() -> None:
    """With a retry pending, every key added must still reach a worker (each add wakes one)."""
    done: list[Hashable] = []

    def handle(key: Hashable, tick: bool) -> None:
        if key == "later" and "later" not in done:
            done.append(key)
            raise Retry(60)
        done.append(key)

    queue = WorkQueue(handle, workers=1)
    queue.add("later")
    wait_for(lambda: done == ["later"], 60, 0.01, "the first try")
    for i in range(200):
        queue.add(i)
        wait_for(lambda i=i: i in done, 60, 0.001, f"key {i} handled")
    queue.close()


def handled_until(queue: WorkQueue, calls: list[Hashable], after: float) -> list[Hashable]:
    """The keys handled until a key of its own, added `after` s from now, is: the delayed adds are
    taken in time order, so one due before it has been handled by then (one worker)."""
    queue.add_after("sentinel", after)
    wait_for(lambda: "sentinel" in calls, 60, 0.01, "the sentinel handled")
    return calls[: calls.index("sentinel")]


def test_a_later_delayed_add_of_a_key_waiting_for_one_is_dropped() -> None:
    """Each tick of a job waiting out its backoff asks for a reconcile when it ends: one comes then."""
    calls: list[Hashable] = []
    asked = [0.5 + 0.05 * i for i in range(6)]  # each tick's reconcile asks again, a little later

    def handle(key: Hashable, tick: bool) -> float | None:
        calls.append(key)
        return asked.pop(0) if tick and asked else None

    queue = WorkQueue(handle, workers=1)
    try:
        for ticks in range(1, 7):
            queue.add("a", tick=True)
            wait_for(lambda ticks=ticks: len(calls) == ticks, 60, 0.01, f"tick {ticks} handled")
        assert handled_until(queue, calls, 1.2) == ["a"] * 7  # the six ticks, then the one asked for
    finally:
        queue.close()


def test_an_earlier_delayed_add_replaces_the_one_pending() -> None:
    calls: list[Hashable] = []
    queue = WorkQueue(lambda key, tick: calls.append(key), workers=1)
    try:
        started = time.monotonic()
        queue.add_after("a", 0.6)
        queue.add_after("a", 0.1)
        wait_for(lambda: "a" in calls, 60, 0.01, "a handled")
        assert time.monotonic() - started < 0.6  # at the earlier time
        assert handled_until(queue, calls, 0.9) == ["a"]  # and not again at the later one
    finally:
        queue.close()
