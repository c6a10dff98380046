"""A work queue of MixedPrecisionJob keys, as controllers built on client-go use one: a key is
queued at most once, never handled by two workers at once, handled again if it was added while
being handled, and retried later when its handler fails.

Two lanes: changes (a CR, Job or pod event) go before the periodic ticks, so a round of ticks
never delays an attempt's start or end. A job whose handling keeps failing backs off
exponentially (`Backoff`, as client-go's per-item rate limiter), up to a cap.

A key waits for a delayed add at most once, as in client-go's delaying queue: the earliest
pending time is kept (a later one is dropped, an earlier one replaces it), so a job whose every
tick asks for the same moment is handled once then, not once per tick.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from mpjob.planning.classify import backoff_seconds

Key = Hashable
log = logging.getLogger("mpjob.operator.workqueue")


class WorkQueue:
    def __init__(self, handle: Callable[[Key, bool], float | None], workers: int, name: str = "mpjob-work") -> None:
        """`handle(key, tick)` does the work; `tick` is True when only the ticker asked for it.
        It may raise `Retry` to be called again after a delay (a failure), or return the seconds
        after which it is to be called again though nothing changes (a wait that ends then: as
        controller-runtime's RequeueAfter); None: not before a change or a tick."""
        self._handle = handle
        lock = threading.RLock()
        self._cv = threading.Condition(lock)  # workers wait here for keys
        self._due = threading.Condition(lock)  # the retry thread waits here (a notify for a
        # key must never wake it instead of a worker)
        self._lanes: tuple[deque[Key], deque[Key]] = (deque(), deque())  # changes, ticks
        self._queued: dict[Key, bool] = {}  # key -> tick only
        self._active: set[Key] = set()
        self._again: dict[Key, bool] = {}  # added while active -> tick only
        self._later: list[tuple[float, int, Key]] = []  # retry heap: (due, seq, key)
        self._pending: dict[Key, tuple[float, int]] = {}  # key -> its one live heap entry (due, seq)
        self._seq = 0
        self._closed = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        self._threads.append(threading.Thread(target=self._delayed, name=f"{name}-retry", daemon=True))
        for thread in self._threads:
            thread.start()

    def add(self, key: Key, tick: bool = False) -> None:
        with self._cv:
            if self._closed:
                return
            if key in self._active:
                self._again[key] = self._again.get(key, True) and tick
                return
            if key in self._queued:
                if self._queued[key] and not tick:  # a change upgrades a queued tick
                    self._queued[key] = False
                    self._lanes[0].append(key)  # the stale entry in the tick lane is skipped
                    self._cv.notify()
                return
            self._queued[key] = tick
            self._lanes[1 if tick else 0].append(key)
            self._cv.notify()

    def add_after(self, key: Key, delay: float) -> None:
        """Add `key` in `delay` s, unless it is already to be added sooner; an entry it replaces
        stays in the heap, stale, and is skipped when due."""
        with self._cv:
            due = time.monotonic() + delay
            if self._closed or (key in self._pending and self._pending[key][0] <= due):
                return
            self._seq += 1
            self._pending[key] = (due, self._seq)
            heapq.heappush(self._later, (due, self._seq, key))
            self._due.notify()

    def __len__(self) -> int:
        with self._cv:
            return len(self._queued)

    def close(self, timeout: float = 0.0) -> list[str]:
        """Take no more keys and wait up to `timeout` s in all for the workers to end; the names of
        those still handling a key."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            self._due.notify()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in self._threads if thread.is_alive()]

    def _next(self) -> tuple[Key, bool] | None:
        with self._cv:
            while not self._closed:
                for lane, tick in zip(self._lanes, (False, True), strict=True):
                    while lane:
                        key = lane.popleft()
                        if key in self._queued and self._queued[key] == tick:
                            del self._queued[key]
                            self._active.add(key)
                            return key, tick
                self._cv.wait()
            return None

    def _done(self, key: Key) -> None:
        with self._cv:
            self._active.discard(key)
            if key in self._again:
                tick = self._again.pop(key)
                self._queued[key] = tick
                self._lanes[1 if tick else 0].append(key)
                self._cv.notify()

    def _work(self) -> None:
        while (item := self._next()) is not None:
            key, tick = item
            try:
                again = self._handle(key, tick)
                if again is not None:
                    self.add_after(key, again)
            except Retry as retry:
                self.add_after(key, retry.delay)
            except Exception:  # a handler's bug must not take a worker with it
                log.exception("handling %s failed", key)
            finally:
                self._done(key)

    def _delayed(self) -> None:
        with self._cv:
            while not self._closed:
                now = time.monotonic()
                while self._later and self._later[0][0] <= now:
                    due, seq, key = heapq.heappop(self._later)
                    if self._pending.get(key) == (due, seq):  # else replaced by an earlier one
                        del self._pending[key]
                        self.add(key)  # the condition's lock is re-entrant
                self._due.wait(self._later[0][0] - now if self._later else None)


class Retry(Exception):
    def __init__(self, delay: float, *args: Any) -> None:
        super().__init__(*args)
        self.delay = delay


class Backoff:
    """Per-key exponential backoff: each failure in a row doubles the wait (from `base`, at most
    `cap`, less up to `jitter` of it so that jobs failing together do not retry together); a
    success forgets the key."""

    def __init__(self, *, base: float, cap: float, jitter: float = 0.1) -> None:
        self.base, self.cap, self.jitter = base, cap, jitter
        self._lock = threading.Lock()
        self._failures: dict[Key, int] = {}
        self._until: dict[Key, float] = {}

    def failed(self, key: Key) -> float:
        """Count a failure of `key`; the seconds to wait before its retry."""
        with self._lock:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
            delay = backoff_seconds(failures, base=self.base, cap=self.cap) * (1 - random.uniform(0, self.jitter))
            self._until[key] = time.monotonic() + delay
            return delay

    def waiting(self, key: Key) -> bool:
        """Whether `key` failed and its retry is not due yet."""
        with self._lock:
            return time.monotonic() < self._until.get(key, 0.0)

    def failures(self, key: Key) -> int:
        with self._lock:
            return self._failures.get(key, 0)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._failures.pop(key, None)
            self._until.pop(key, None)
