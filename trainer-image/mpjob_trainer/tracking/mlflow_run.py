"""The MLflow side of tracking: one run per job, one nested run per attempt, through MLflow's
own client (`mlflow-skinny`, the trainer's `mlflow` extra). Only the tracking thread calls it.

Why nested runs, not one run with attempts as tags: attempts overlap in steps (an attempt
after a fallback trains again the steps between the last good checkpoint and the fault), and
each has its own precision, so each attempt's series is its own run, tagged with its index,
precision and, when it gave up, the fault that ended it. The job's run holds the params, the
whole timeline (every attempt's metrics, re-trained steps included, in the order they ran)
and a tag per fallback; it is found again by every later attempt (and after a restart of the
same one) by the job's key tag, never created twice by one job.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

from mpjob_contract.formats import whole_number
from mpjob_trainer.tracking.records import (
    TAG_ATTEMPT,
    TAG_ENDING,
    TAG_JOB_KEY,
    TAG_LEVEL,
    TAG_PARENT,
    Change,
    Point,
    params_kept,
)

#: MLflow's client retries a failed request for minutes by default; the tracking thread may
#: not hold the end of an attempt that long. Its usage telemetry is off: a trainer pod reaches
#: the tracking server it was given and nothing else, and the thread that fetched the telemetry
#: settings at import, failing (no route out), removed an environment variable while the
#: client's first request read it (a KeyError that failed the attempt's run). The user's own
#: settings win.
CLIENT_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    "MLFLOW_DISABLE_TELEMETRY": "true",
}
#: The `mpjob.ending` of an attempt's run its own process never ended (the next attempt did).
ENDING_UNREPORTED = "Unreported"
#: Earlier attempts' runs left RUNNING that one attempt ends (a job keeps 20 attempts' records).
MAX_STALE = 100
#: MLflow's log_batch limit on metrics per request.
BATCH_METRICS = 1000
#: The credentials of a URL (scheme://user:password@host), as MLflow's errors quote a tracking URI.
USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^\s/]*@")


class OpenIncomplete(Exception):
    """The job's run is open (RUNNING: records and the end go to it) but a part of the attempt's
    opening is not done (`failed`: which, and why); `opened`: whether the attempt's run was made
    (if not, its records go to the job's run only until it is)."""

    def __init__(self, attempt: int, failed: list[str], *, opened: bool) -> None:
        self.attempt, self.failed, self.opened = attempt, failed, opened
        where = (
            "" if opened else f" (attempt {attempt} has no run of its own yet: its records go to the job's run only)"
        )
        super().__init__(f"the opening of attempt {attempt}'s runs not all done{where}: {'; '.join(failed)}")


class ChangeIncomplete(Exception):
    """Part of a change in place did not reach the tracking server (`failed`: which, and why);
    `opened`: whether the next attempt's run was made (if not, its records go to the job's run
    only: no attempt's run takes another's)."""

    def __init__(self, attempt: int, failed: list[str], *, opened: bool) -> None:
        self.attempt, self.failed, self.opened = attempt, failed, opened
        where = "" if opened else f" (attempt {attempt} has no run of its own: its records go to the job's run only)"
        super().__init__(f"the change in place to attempt {attempt} not all recorded{where}: {'; '.join(failed)}")


def first_line(exc: BaseException) -> str:
    """An error's first line, cut to 300 characters, no URL's user:password@ in it: what a warning quotes."""
    return USERINFO.sub(r"\1", str(exc)).splitlines()[0][:300] if str(exc) else ""


def each(parts: list[tuple[str, Callable[[], None]]]) -> list[str]:
    """Try every part (what it does, how), whichever fail: what failed and why, in order."""
    failed = []
    for what, part in parts:
        try:
            part()
        except Exception as exc:
            failed.append(f"{what}: {type(exc).__name__}: {first_line(exc)}")
    return failed


class MlflowRuns:
    """The job's run and this attempt's nested run on one tracking server."""

    def __init__(self, *, uri: str, experiment: str, key: str) -> None:
        for name, value in CLIENT_DEFAULTS.items():
            os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient  # the extra: imported on the tracking thread only

        self.client = MlflowClient(tracking_uri=uri)
        self.experiment_name, self.key = experiment, key
        self.experiment_id = ""
        self.job_run = ""
        self.attempt_run = ""
        #: What open has done (called again after a failure partway, it does what is left). The
        #: params are owed to a found job's run too: the attempt that made it may have died first.
        self.params_owed = True
        self.swept = False
        #: The runs changes in place ended whose end the server did not take (run -> its change):
        #: ended as the change ended them at the next open (the tracker's retries) or at the end.
        self.ends_owed: dict[str, Change] = {}
        #: What the job's run keeps of its first params where this attempt's differ (None: nothing).
        self.kept: str | None = None
        #: The attempt's run's last step by metric: one trained again (a rollback in place, the attempt
        #: started again) is not logged to it again.
        self.last_step: dict[str, int] = {}

    def open(self, *, job_name: str, attempt: int, params: dict[str, str], tags: dict[str, str]) -> None:
        """Find or make the experiment, the job's run (with its params) and the attempt's run.
        Each part once: the job's run, once found or made (and RUNNING), is kept, so records and
        the end go to it whatever fails after; the parts after it are each tried whatever became
        of the others (OpenIncomplete names those that failed), and done at the next call."""
        if not self.experiment_id:
            self.experiment_id = self._experiment()
        if not self.job_run:
            self.job_run = self._job_run(job_name)
        owed: list[tuple[str, Callable[[], None]]] = []
        if self.params_owed:
            owed.append(("logging the job's params", lambda: self._params(params)))
        if not self.swept:
            owed.append(("ending earlier attempts' runs left RUNNING", lambda: self._end_unreported(attempt)))
        if self.ends_owed:
            owed.append(("ending the runs changes in place ended", self._end_owed))
        if not self.attempt_run:
            owed.append((f"opening attempt {attempt}'s run", lambda: self.begin(job_name, attempt, tags)))
        if failed := each(owed):
            raise OpenIncomplete(attempt, failed, opened=bool(self.attempt_run))

    @property
    def complete(self) -> bool:
        """Whether all open does is done (else the next call does what is left)."""
        return bool(self.attempt_run) and not self.params_owed and self.swept and not self.ends_owed

    def _job_run(self, job_name: str) -> str:
        """The job's run, RUNNING: made by the job's first attempt, else found (an earlier attempt
        ended it as it ended: the job goes on)."""
        found = self._find(f"tags.`{TAG_JOB_KEY}` = '{self.key}' and tags.`{TAG_LEVEL}` = 'job'")
        if found is None:
            run = self.client.create_run(
                self.experiment_id, run_name=job_name, tags={TAG_JOB_KEY: self.key, TAG_LEVEL: "job"}
            )
            self.swept = True  # a new job's run: no earlier attempt's under it
            return str(run.info.run_id)
        self.client.update_run(found, status="RUNNING")
        return found

    def begin(self, job_name: str, attempt: int, tags: dict[str, str]) -> None:
        """Find (an attempt started again) or make the attempt's run, nested in the job's."""
        mine = f"tags.`{TAG_PARENT}` = '{self.job_run}' and tags.`{TAG_ATTEMPT}` = '{attempt}'"
        again = self._find(mine)
        if again is None:
            run = self.client.create_run(
                self.experiment_id,
                run_name=f"{job_name}-attempt-{attempt}",
                tags={
                    **tags,
                    TAG_ATTEMPT: str(attempt),
                    TAG_LEVEL: "attempt",
                    TAG_PARENT: self.job_run,
                    TAG_JOB_KEY: self.key,
                },
            )
            again, self.last_step = run.info.run_id, {}
        else:
            self.client.update_run(again, status="RUNNING")
            keys = self.client.get_run(again).data.metrics
            self.last_step = {k: max(m.step for m in self.client.get_metric_history(again, k)) for k in keys}
        self.attempt_run = again

    def change(self, change: Change, *, job_name: str) -> None:
        """A change made in place: the attempt's run ends as its restart would have ended it (at
        the change), the job's run, still RUNNING, takes its tags, and the next attempt's opens.
        All or nothing to the caller: from here no record goes to the ending attempt's run, the
        next attempt's takes them only once made, and each part is tried whatever became of the
        others; ChangeIncomplete, after all were tried, names those that failed."""
        ending, self.attempt_run = self.attempt_run, ""
        parts: list[tuple[str, Callable[[], None]]] = [
            (f"ending attempt {change.attempt - 1}'s run", lambda: self._end_changed(ending, change)),
            (f"tagging the job's run ({', '.join(change.job_tags)})", lambda: self._tag(self.job_run, change.job_tags)),
            (f"opening attempt {change.attempt}'s run", lambda: self._begin_changed(change, job_name)),
        ]
        if failed := each(parts):
            raise ChangeIncomplete(change.attempt, failed, opened=bool(self.attempt_run))

    def _end_changed(self, run: str, change: Change) -> None:
        if run:
            self.ends_owed[run] = change
            self._end_owed()

    def _end_owed(self) -> None:
        """End each run a change in place ended as that change ended it (its ending tags, its
        status, at its moment); one the server refuses stays owed, its run RUNNING meanwhile."""
        for run, change in list(self.ends_owed.items()):
            self._tag(run, change.ending_tags)
            self.client.set_terminated(run, status=change.status, end_time=change.at_ms)
            del self.ends_owed[run]

    def _begin_changed(self, change: Change, job_name: str) -> None:
        self.begin(job_name, change.attempt, change.tags)

    def _tag(self, run: str, tags: dict[str, str]) -> None:
        for name, value in tags.items():
            self.client.set_tag(run, name, value)

    def log(self, points: list[Point], *, attempt_tags: dict[str, str], job_tags: dict[str, str]) -> None:
        """Metrics to both runs (the job's timeline; the attempt's series, each step once), tags to each."""
        from mlflow.entities import Metric, RunTag

        last, first = dict(self.last_step), []
        for p in points:
            if p.step > last.get(p.key, -1):
                last[p.key] = p.step
                first.append(p)
        for run, tags, sent in ((self.attempt_run, attempt_tags, first), (self.job_run, job_tags, points)):
            metrics = [Metric(p.key, p.value, p.timestamp_ms, p.step) for p in sent]
            for start in range(0, max(1, len(metrics)), BATCH_METRICS) if run else []:
                chunk = metrics[start : start + BATCH_METRICS]
                run_tags = [RunTag(k, v) for k, v in tags.items()] if start == 0 else []
                if chunk or run_tags:
                    self.client.log_batch(run, metrics=chunk, tags=run_tags, synchronous=True)
            if run and run == self.attempt_run:
                self.last_step = last

    def end(self, *, status: str, tags: dict[str, str], job_done: bool) -> None:
        """End the attempt's run (if it has one: a change in place or an open may have failed to
        make it) and the job's (if open): FINISHED when this attempt finished the job, else as the attempt ended;
        runs changes in place ended whose end the server refused (`ends_owed`) are tried once more.
        Whether another attempt follows is the planner's decision, made after this process is
        gone: the next attempt sets the job's run RUNNING again, so a job that fails for good
        leaves it FAILED, never RUNNING."""
        now = int(time.time() * 1000)
        missed: Exception | None = None
        try:  # a last try at the runs changes in place ended; what fails is raised once these end
            self._end_owed()
        except Exception as exc:
            missed = exc
        if self.attempt_run:
            self._tag(self.attempt_run, tags)
            self.client.set_terminated(self.attempt_run, status=status, end_time=now)
        if self.job_run and (job_done or status != "FINISHED"):
            self.client.set_terminated(self.job_run, status="FINISHED" if job_done else status, end_time=now)
        if missed is not None:
            raise missed

    def _end_unreported(self, attempt: int) -> None:
        """End the runs of earlier attempts still RUNNING: their processes died before ending
        them (a killed `mpjob run`, an OOMKilled pod, a lost node, a server down at their end).
        KILLED, `mpjob.ending: Unreported` (the job's status has the reason), at the last point
        they logged (else their start): no time after it is claimed as theirs."""
        query = f"tags.`{TAG_PARENT}` = '{self.job_run}' and attributes.status = 'RUNNING'"
        for run in self.client.search_runs([self.experiment_id], filter_string=query, max_results=MAX_STALE):
            if (tagged := whole_number(run.data.tags.get(TAG_ATTEMPT, ""))) is None or tagged >= attempt:
                continue  # this attempt's own run (started again) or a later one's: not ours to end
            points = [m.timestamp for m in self.client.get_metric_history(run.info.run_id, "loss")]
            ended = max(points, default=run.info.start_time)
            self.client.set_tag(run.info.run_id, TAG_ENDING, ENDING_UNREPORTED)
            self.client.set_terminated(run.info.run_id, status="KILLED", end_time=ended)
        self.swept = True

    def _experiment(self) -> str:
        found = self.client.get_experiment_by_name(self.experiment_name)
        if found is not None:
            return str(found.experiment_id)
        try:
            return str(self.client.create_experiment(self.experiment_name))
        except Exception:  # another job made it meanwhile
            again = self.client.get_experiment_by_name(self.experiment_name)
            if again is None:
                raise
            return str(again.experiment_id)

    def _find(self, query: str) -> str | None:
        runs = self.client.search_runs([self.experiment_id], filter_string=query, max_results=1)
        return runs[0].info.run_id if runs else None

    def _params(self, params: dict[str, str]) -> None:
        """The params the job's run lacks, once: those it holds (logged by an earlier try or
        attempt, or by a request whose answer was lost) are not sent again; a value it holds
        differently stays (MLflow keeps a param's first value: the job's as its run began), and
        `kept` says so (`params_kept`), for the tracker to tell."""
        from mlflow.entities import Param

        held = self.client.get_run(self.job_run).data.params
        self.kept = params_kept(held, params)
        items: list[Any] = [Param(k, v) for k, v in params.items() if k not in held]
        for start in range(0, len(items), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.job_run, params=items[start : start + 100], synchronous=True)
        self.params_owed = False
