"""Live progress: a running attempt's figures (step, loss, loss scale, overflow steps,
throughput, where it resumed, its last good checkpoint, what the run skipped), read from rank
0's Prometheus endpoint (the one Prometheus scrapes; the trainer holds no Kubernetes token), and
the status they make (`observed_in`), which the reconcile plans from and writes.

Reads run off the reconcile workers, in a small pool of their own (`ProgressReader`): a tick's
reconcile asks for a read and applies the one that finished since its last tick, so a slow or
hostile endpoint delays only its own job's figures, by at most one read's deadline (`scrape.py`).
An endpoint that failed is asked again only after a backoff. This module only translates the
exposition (parsed once, where the text is read: `exposition.py`) into a `Reading`; what a
reading changes in the status is `planning/observe.py`'s decision, the same one `mpjob run`
makes of the trainer's event lines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from mpjob.controller import metrics as om
from mpjob.controller.exposition import FIGURES, PRECISIONS, Exposition, parse
from mpjob.controller.records import Key
from mpjob.controller.scrape import ScrapeError, fetch
from mpjob.planning import history
from mpjob.planning import status as st
from mpjob.planning.classify import backoff_seconds
from mpjob.planning.observe import LIVE, CheckpointReading, Observation, Reading, observe, real
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobStatus, Precision
from mpjob_contract.report import InPlaceChange
from mpjob_contract.skipping import MAX_SKIPPED_ENTRIES, Skipped, SkippedStep

log = logging.getLogger("mpjob.operator.progress")

#: The longest pause before an endpoint that keeps failing is read again.
BACKOFF_CAP = 60.0


def quarantine(found: Exposition) -> Skipped | None:
    """The run's quarantine as the reading shows it: its counts (never below its listing) and its
    listed steps in the trainer's order, the first MAX_SKIPPED_ENTRIES; None when it shows none."""
    listed: dict[tuple[int, str], SkippedStep] = {}
    for skip in sorted(found.skips, key=lambda s: s.place):
        if len(listed) == MAX_SKIPPED_ENTRIES:
            break
        listed.setdefault((skip.entry.step, skip.entry.cause), skip.entry)
    steps = list(listed.values())
    count = max(int(found.values.get(tm.QUARANTINE_STEPS, 0)), len(steps))
    if not count:
        return None
    return Skipped(count=count, samples=max(int(found.values.get(tm.QUARANTINE_SAMPLES, 0)), 0), steps=steps)


def last_checkpoint(found: Exposition) -> CheckpointReading | None:
    """The newest checkpoint a reading names with its sha256 (a scrape may catch the previous
    one's series still there: the newest step wins), else the step of one it names without
    (a trainer that does not label its sha256), else None."""
    if found.checkpoints:
        return max(found.checkpoints, key=lambda c: (c.step, c.sha256, c.precision or ""))
    if found.values.get(tm.LAST_GOOD_CHECKPOINT_STEP, 0) > 0:
        return CheckpointReading(step=int(found.values[tm.LAST_GOOD_CHECKPOINT_STEP]))
    return None


def reading_of(found: Exposition, *, attempt: int | None = None) -> Reading:
    """The exposition as a Reading (what it changes in a status: `observe`)."""
    values = found.values
    figures = {name: cast(values[metric]) for name, metric, cast in FIGURES if metric in values}
    start = values.get(tm.START_STEP)
    chosen, seconds = measured(found)
    return Reading(
        attempt=attempt,
        **figures,
        start_step=None if start is None else (int(start) if start >= 0 else -1),
        recovery_seconds=values.get(tm.RECOVERY_SECONDS),
        checkpoint=last_checkpoint(found),
        measured_precision=chosen,
        measured_step_seconds=seconds,
        skipped=quarantine(found),
    )


def measured(found: Exposition) -> tuple[Precision | None, dict[str, float | None] | None]:
    """An `auto` attempt's choice and step times, once it has measured: the choice is the
    precision label its measured series were set under, not the one it trains in now (a
    fallback in place moves that)."""
    by_candidate = found.by_precision.get(tm.MEASURED_STEP_SECONDS, {})
    seconds = {p: by_candidate[p] for p in PRECISIONS if p in by_candidate}
    chosen = sorted(found.measured_in)
    if not seconds or len(chosen) != 1:
        return None, None
    return chosen[0], {p: (s if s >= 0 else None) for p, s in seconds.items()}


#: The live figures as a scrape's "found" mapping names them (the status's camelCase names).
_CAMEL = {name: MixedPrecisionJobStatus.model_fields[name].alias or name for name in LIVE}


def figures(exposition: Exposition, *, precision: str | None) -> dict[str, Any]:
    """What a read found, by status field (plus startStep and the last checkpoint when known):
    the reading's real figures (`observe.real`), in the form a read hands to the reconciler."""
    seen = real(reading_of(exposition), precision=precision)
    found: dict[str, Any] = {_CAMEL[n]: getattr(seen, n) for n in LIVE if getattr(seen, n) is not None}
    if seen.measured_precision is not None:
        found.update(precision=seen.measured_precision, measuredStepSeconds=seen.measured_step_seconds)
    if seen.start_step is not None:
        found["startStep"] = seen.start_step
    if seen.recovery_seconds is not None:
        found["recoverySeconds"] = seen.recovery_seconds
    if (ck := seen.checkpoint) is not None and ck.sha256:
        found["lastCheckpoint"] = {"step": ck.step, "sha256": ck.sha256, "precision": ck.precision}
    elif ck is not None:
        found["lastCheckpointStep"] = ck.step
    if seen.skipped is not None:
        found["skipped"] = seen.skipped.model_dump(by_alias=True)
    if made := exposition.changes:
        found["precisionChanges"] = [made[i].model_dump(by_alias=True) for i in sorted(made)]
    return found


def observed_in(
    old: MixedPrecisionJobStatus, read: Read | None, made: list[InPlaceChange], now: datetime, every_steps: int
) -> Observation:
    """`old` with what a read of its running attempt found, if any. A read that lists changes in
    place (`made`) holds the figures of the attempt the last one began: they go in once the plan
    has recorded it (a read of an attempt that ended meanwhile changes nothing); `every_steps`:
    checkpoint.everySteps (planning/lapse.py)."""
    if read is None:
        return Observation(old)
    target, reading = read
    whose = max([target.attempt, *(change.attempt for change in made)])
    return observe(old, found_reading(reading, attempt=whose), at=st.stamp(now), every_steps=every_steps)


def changes_found(found: dict[str, Any]) -> list[InPlaceChange]:
    """The fallbacks in place a read found, oldest first."""
    return [InPlaceChange.model_validate(change) for change in found.get("precisionChanges", [])]


def found_reading(found: dict[str, Any], *, attempt: int | None = None) -> Reading:
    """A read's `found` mapping back as the Reading it came from."""
    named, step = found.get("lastCheckpoint"), found.get("lastCheckpointStep")
    return Reading(
        attempt=attempt,
        **{n: found[_CAMEL[n]] for n in LIVE if _CAMEL[n] in found},
        start_step=found.get("startStep"),
        recovery_seconds=found.get("recoverySeconds"),
        checkpoint=CheckpointReading(**named) if named else (CheckpointReading(step=step) if step else None),
        measured_precision=found.get("precision"),
        measured_step_seconds=found.get("measuredStepSeconds"),
        skipped=Skipped.model_validate(found["skipped"]) if "skipped" in found else None,
    )


@dataclass(frozen=True, slots=True)
class Target:
    """Whose endpoint to read: a job's attempt, its rank-0 pod's address and its precision."""

    attempt: int
    ip: str
    precision: str | None
    port: int = tm.DEFAULT_METRICS_PORT


#: What the last finished read of a running attempt found: its target and figures.
Read = tuple[Target, dict[str, Any]]


@dataclass
class _Endpoint:
    target: Target
    busy: bool = False
    reading: dict[str, Any] | None = None
    failures: int = 0
    not_before: float = 0.0
    #: When this process first asked for a read of `target` (its clock), and whether it has taken
    #: one since: until it has, the status's progressTime is another process's sight.
    since: float = 0.0
    taken: bool = False


class ProgressReader:
    """Reads of rank-0 endpoints in a pool of `concurrency` threads, each read bounded by
    `deadline` seconds and `max_bytes` bytes; at most one read per job at a time."""

    def __init__(
        self, *, concurrency: int, deadline: float, max_bytes: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.deadline, self.max_bytes, self._clock = deadline, max_bytes, clock
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="mpjob-progress")
        self._lock = threading.Lock()
        self._endpoints: dict[Key, _Endpoint] = {}

    def take(self, key: Key, target: Target) -> dict[str, Any] | None:
        """The reading of `target` finished since the last take, if any (never another attempt's)."""
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None or endpoint.target != target:
                return None
            reading, endpoint.reading = endpoint.reading, None
            endpoint.taken = endpoint.taken or reading is not None
            return reading

    def request(self, key: Key, target: Target) -> None:
        """Start a read of `target` unless one runs or its endpoint is backing off. Never waits."""
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None or endpoint.target != target:
                endpoint = self._endpoints[key] = _Endpoint(target, since=self._clock())
            if endpoint.busy or self._clock() < endpoint.not_before:
                return
            endpoint.busy = True
        self._pool.submit(self._read, key, endpoint)

    def poll(self, key: Key, status: MixedPrecisionJobStatus, rank0_ip: dict[int, str]) -> Read | None:
        """For a running job: what the last finished read of its attempt's rank 0 (at its address
        in `rank0_ip`) found, if any; the next read starts (off the caller's thread: a slow
        endpoint never holds a reconcile)."""
        ip = rank0_ip.get(history.job_index(status, status.attempt))  # one begun in place: its chain's
        if status.phase != "Running" or not ip:
            return None
        target = Target(attempt=status.attempt, ip=ip, precision=status.precision)
        reading = self.take(key, target)
        self.request(key, target)
        return (target, reading) if reading else None

    def unseen_for(self, key: Key, attempt: int) -> float | None:
        """Seconds this process has been reading `attempt` without taking a reading of it (0.0:
        it has not asked yet); None once it has taken one. Until then the attempt's progressTime
        is what an earlier process saw (an operator restarted, or another peer): its step may
        have moved since, so a stall is not judged on that alone (`cutoff.stalled`)."""
        with self._lock:
            endpoint = self._endpoints.get(key)
            if endpoint is None or endpoint.target.attempt != attempt:
                return 0.0
            return None if endpoint.taken else self._clock() - endpoint.since

    def forget(self, key: Key) -> None:
        with self._lock:
            self._endpoints.pop(key, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _read(self, key: Key, endpoint: _Endpoint) -> None:
        target, reading = endpoint.target, None
        try:
            text = fetch(target.ip, target.port, deadline=self.deadline, max_bytes=self.max_bytes)
            reading = figures(parse(text), precision=target.precision)
        except ScrapeError as exc:
            log.debug("reading %s/%s's progress at %s failed: %s", *key, target.ip, exc)
        except Exception:  # a bug here must not leave the endpoint busy for good
            log.exception("reading %s/%s's progress at %s failed", *key, target.ip)
        finally:
            self._done(endpoint, reading)

    def _done(self, endpoint: _Endpoint, reading: dict[str, Any] | None) -> None:
        with self._lock:
            endpoint.busy = False
            if reading is None:
                om.SCRAPE_FAILURES.inc()
                endpoint.failures += 1
                delay = backoff_seconds(endpoint.failures, base=self.deadline, cap=BACKOFF_CAP)
                endpoint.not_before = self._clock() + delay
            else:
                endpoint.failures, endpoint.reading = 0, reading
