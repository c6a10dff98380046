"""Experiment tracking (spec.tracking.mlflow): rank 0 logs the attempt to MLflow.

Logging never holds up or ends training. The training thread only hands each event line to
`RunTracker.__call__`, which turns it into records and puts them on a bounded queue without
waiting (a full queue drops the update and counts it); one thread of its own talks to the
tracking server. Any failure there (server down, bad credentials, the `mlflow` extra not
installed) is logged on stderr (the first, then every 100th) and counted in
`mpjob_trainer_tracking_failures_total`; it is never raised. The first is also told as a
`trackingFailed` event line, written by the training thread at its next line (or at the end),
so `mpjob run` shows it on its console; so is each failure that leaves the runs short of what
happened (a change in place not all recorded, the runs' end). At the end of the attempt
`close` waits a bounded time (MPJOB_TRACKING_CLOSE_SECONDS, 30 s) for what is left, sent in
one batch, and the runs' ends; an end not done by then is told as a failure too, and a failure
after that (the late end refused) is told by the tracking thread itself, while the process lives.

A change made in place (a fallback, a re-promotion, a smaller micro-batch: session.inplace)
ends one attempt and begins the next in the same processes: its `precisionChanged` line ends
the attempt's run as the restart's exit would have ended it and opens the next attempt's, so a
job tracks alike however it recovers. Every update carries the attempt it was written in and
the change is kept beside the queue, never on it: a full queue drops updates, never a change,
so no attempt's records land in another attempt's run. A change the server took only in part
(mlflow_run.ChangeIncomplete) sends nothing more to the ended attempt's run; an end of that run
it refused is owed, tried again as below and at the attempt's end, so the run ends as the change
ended it (not KILLED 'Unreported' by a later attempt's process, RUNNING meanwhile).

What the runs lack is tried again every REOPEN_SECONDS (at the next records, never in a loop of
its own), and what was made is kept meanwhile: once the job's run is open (RUNNING), records
and the end go to it, so it ends as the attempt ends even if nothing else was made; an attempt
whose run was not made (at the start, or at a change in place) sends its records to the job's
run only until it is (`degraded` says why, told once), then to its run too.
"""

from __future__ import annotations

import collections
import os
import queue
import sys
import threading
import time
from typing import Any

from mpjob_contract.codes import reason_for_exit_code
from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.tracking import IMAGE_ENV
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.tracking.mlflow_run import ChangeIncomplete, MlflowRuns, OpenIncomplete, first_line
from mpjob_trainer.tracking.records import (
    TAG_ENDING,
    Change,
    Update,
    attempt_tags,
    change_for,
    job_key,
    job_params,
    run_status,
    update_for,
)

__all__ = ["RunTracker", "track"]

QUEUE_SIZE = 1024
#: Updates sent to the server in one go (metrics of several log intervals).
BATCH_UPDATES = 64
CLOSE_SECONDS_ENV = "MPJOB_TRACKING_CLOSE_SECONDS"
#: What the runs lack (the server not reached at the start, the attempt's run not made at the
#: start or at a change in place, the end of the run a change in place ended) is tried again
#: this often, at the next records.
REOPEN_SECONDS = 30.0


class _End:
    """The last item: end the run of `attempt` (the one the processes trained last) with this exit code."""

    def __init__(self, code: int, attempt: int) -> None:
        self.code, self.attempt = code, attempt


class RunTracker:
    """The bounded hand-off from the training thread to the tracking thread."""

    def __init__(
        self, launch: AttemptLaunch, *, digest: str, metrics: TrainerMetrics, log: EventLog | None = None
    ) -> None:
        self.launch, self.digest, self.log = launch, digest, log
        self.queue: queue.Queue[Update | _End] = queue.Queue(maxsize=QUEUE_SIZE)
        self.metrics = metrics  # its children are read at use: an `auto` attempt relabels them
        self.failed = 0
        #: The failures to tell, until the training thread told them (`trackingFailed` lines):
        #: the first, and each that leaves the runs short of what happened (`_failed`'s `tell`).
        self.untold: collections.deque[str] = collections.deque()
        #: Why this attempt's records go to the job's run only (its run not made yet, at the start
        #: or at a change in place: tried again every REOPEN_SECONDS).
        self.degraded: str | None = None
        self.tried_at = 0.0  # when the tracking thread last tried to open what the runs lack
        self._counting = threading.Lock()
        #: Held from a check of `untold` until its line is written: after the close both threads
        #: tell (re-entrant: this tracker hears its own line, and tells what is left then).
        self._telling = threading.RLock()
        #: The training thread's close is done: it tells nothing more, the tracking thread tells
        #: its own failures then (a close that timed out leaves it at work).
        self.closed = False
        #: The session finished (its `done` line): the job succeeded, at spec.training.steps or
        #: short of them (stop_early, a loop that left), and no attempt follows to end its run.
        self.job_done = False
        #: The attempt the processes train now (the training thread's), and the changes made in
        #: place by the attempt each began: written before any update of that attempt is queued.
        self.attempt = launch.attempt
        self.changes: dict[int, Change] = {}
        #: The attempt whose run the tracking thread sends to (the tracking thread's).
        self.sending = launch.attempt
        self.closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpjob-tracking", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the training thread
    def __call__(self, event: str, record: dict[str, Any]) -> None:
        """An event line: its records onto the queue, never waiting, never raising."""
        try:
            if self.untold:
                self._tell()
            if event == "done":  # the job's end wherever it stands: spec.training.steps or an early stop
                self.job_done = True
            if event == "precisionChanged":
                change = change_for(record)
                self.changes[change.attempt], self.attempt = change, change.attempt
                return
            update = update_for(event, record, attempt=self.attempt)
            if update is not None:
                update.attempt = self.attempt
                self.queue.put_nowait(update)
        except queue.Full:
            self.metrics.tracking_dropped.inc()
        except Exception as exc:
            self._failed(exc)

    def close(self, code: int) -> None:
        """End the attempt's run and wait (bounded) for the queue to drain; what failed is told
        (the line after the attempt's last), an end that did not go in time too."""
        self.closing.set()  # the tracking thread now takes all that is queued in one batch
        seconds = float(os.environ.get(CLOSE_SECONDS_ENV, "30"))
        deadline = time.monotonic() + seconds
        try:
            self.queue.put(_End(code, self.attempt), timeout=max(0.1, deadline - time.monotonic()))
        except queue.Full:
            self.metrics.tracking_dropped.inc()
        else:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            late = f"the attempt's runs not ended within {seconds:g} s ({CLOSE_SECONDS_ENV}): they may stay RUNNING"
            self._failed(TimeoutError(late), tell=True)
        with self._counting:
            self.closed = True
        self._tell()

    def _tell(self) -> None:
        """The failures to tell, each once, on the event lines (the training thread's stdout; the
        tracking thread's after the close, which may have left it at work): one thread at a time,
        so none finds `untold` emptied between its check and its take, and they go in order."""
        with self._telling:
            while self.untold:
                error = self.untold.popleft()
                if self.log is not None:
                    self.log("trackingFailed", error=error)

    # ---------------------------------------------------------------- the tracking thread
    def _run(self) -> None:
        runs = self._open(None)
        while True:
            first = self.queue.get()  # closing: all that is left goes in one send, then the end
            batch = [first, *self._more(None if self.closing.is_set() else BATCH_UPDATES)]
            ended = next((b for b in batch if isinstance(b, _End)), None)
            if (runs is None or not runs.complete) and time.monotonic() - self.tried_at > REOPEN_SECONDS:
                runs = self._reopen(runs, first.attempt)
            self._deliver(runs, batch)
            if ended is not None:
                self._end(runs, ended.code)
                return

    def _reopen(self, runs: MlflowRuns | None, attempt: int) -> MlflowRuns | None:
        """Open what the runs lack, `attempt`'s records coming next: with no job's run yet, from
        that attempt on; else the attempt sent to now (the changes up to `attempt` open theirs)."""
        if runs is None or not runs.job_run:
            self.sending = attempt
        return self._open(runs) if self.sending == attempt else runs

    def _deliver(self, runs: MlflowRuns | None, batch: list[Update | _End]) -> None:
        """The batch's updates in order, each to its attempt's run: where the attempt changed in
        place, the updates before go to the run that ends, the ones after to the next attempt's."""
        pending: list[Update] = []
        for item in batch:
            if item.attempt != self.sending:
                self._send(runs, pending)
                pending = []
                self._advance(runs, item.attempt)
            if isinstance(item, Update):
                pending.append(item)
        self._send(runs, pending)

    def _advance(self, runs: MlflowRuns | None, attempt: int) -> None:
        """End the runs of the attempts changed in place up to `attempt`, and open its run."""
        begun = sorted(index for index in list(self.changes) if self.sending < index <= attempt)
        self.sending = attempt
        if runs is None or not runs.job_run:  # no job's run yet: opened for `attempt` at the next try
            return
        for index in begun:
            try:
                runs.change(self.changes[index], job_name=self.launch.job_name)
                self.degraded = None
            except ChangeIncomplete as exc:  # no record goes to the ended attempt's run all the same
                self.degraded, self.tried_at = None if exc.opened else str(exc), time.monotonic()
                self._failed(exc, tell=True)

    def _more(self, limit: int | None) -> list[Update | _End]:
        """What else waits on the queue (at most `limit` items), up to the end marker."""
        taken: list[Update | _End] = []
        while limit is None or len(taken) < limit:
            try:
                taken.append(self.queue.get_nowait())
            except queue.Empty:
                break
            if isinstance(taken[-1], _End):
                break
        return taken

    def _open(self, runs: MlflowRuns | None) -> MlflowRuns | None:
        """Open what `runs` (None: nothing yet) lacks for the attempt sent to. What a failure
        leaves made is kept: once the job's run is open, records and the end go to it, and the
        attempt's run, if not made, takes its records once it is (`degraded` says why meanwhile)."""
        settings = self.launch.spec.tracking.mlflow if self.launch.spec.tracking else None
        assert settings is not None
        self.tried_at = time.monotonic()
        try:
            runs = runs or MlflowRuns(uri=settings.uri, experiment=settings.experiment, key=job_key(self.launch))
            params = job_params(self.launch, digest=self.digest, image=os.environ.get(IMAGE_ENV, ""))
            change = self.changes.get(self.sending)
            tags = change.tags if change is not None else attempt_tags(self.launch)
            runs.open(job_name=self.launch.job_name, attempt=self.sending, params=params, tags=tags)
            self.degraded = None
        except OpenIncomplete as exc:  # told once (a retry failing the same is counted)
            told, self.degraded = self.degraded, None if exc.opened else str(exc)
            self._failed(exc, tell=told is None and self.degraded is not None)
        except Exception as exc:
            self._failed(exc)
        if runs is not None and runs.kept is not None:  # a warning, told as a failure is: the values did not go
            said, runs.kept = runs.kept, None
            print(f"mpjob: tracking: {said}", file=sys.stderr)
            with self._counting:
                self.untold.append(said)
        return runs

    def _send(self, runs: MlflowRuns | None, updates: list[Update]) -> None:
        if runs is None or not updates:
            return
        merged = Update()
        for update in updates:
            merged.metrics += update.metrics
            merged.attempt_tags.update(update.attempt_tags)
            merged.job_tags.update(update.job_tags)
        try:
            runs.log(merged.metrics, attempt_tags=merged.attempt_tags, job_tags=merged.job_tags)
        except Exception as exc:
            self._failed(exc)

    def _end(self, runs: MlflowRuns | None, code: int) -> None:
        if runs is None:
            return
        try:
            tags = {TAG_ENDING: str(reason_for_exit_code(code))}
            runs.end(status=run_status(code), tags=tags, job_done=code == 0 and self.job_done)
        except Exception as exc:
            self._failed(exc, tell=True)

    def _failed(self, exc: BaseException, *, tell: bool = False) -> None:
        """Count a failure, print it on stderr (the first, every 100th, each told) and keep it to
        tell on the event lines: the first, and `tell` ones (a change or an end not recorded,
        which leave the runs short of what happened) whatever was told before."""
        with self._counting:  # the training thread's close and the tracking thread may both fail
            self.metrics.tracking_failures.inc()
            self.failed += 1
            error = f"{type(exc).__name__}: {first_line(exc)}"
            if self.failed == 1 or tell:
                self.untold.append(error)
            if self.failed == 1 or self.failed % 100 == 0 or tell:
                print(f"mpjob: tracking failed ({self.failed} so far): {error}", file=sys.stderr)
            closed = self.closed
        if closed:  # no training thread tells it now: a late end (after a timed-out close) is told here
            self._tell()


def track(
    launch: AttemptLaunch, *, rank0: bool, digest: str, metrics: TrainerMetrics, log: EventLog | None = None
) -> RunTracker | None:
    """A RunTracker for rank 0 of a job with spec.tracking.mlflow, else None (`log`: where its
    first failure is told)."""
    tracking = launch.spec.tracking
    if not rank0 or tracking is None or tracking.mlflow is None:
        return None
    return RunTracker(launch, digest=digest, metrics=metrics, log=log)
