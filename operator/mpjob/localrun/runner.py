"""LocalRun: a MixedPrecisionJob on this machine, attempt by attempt, with the operator's planner
and failure policy (mpjob.planning). Each attempt is `workers` local trainer processes (gloo
rendezvous on loopback); the run directory holds the checkpoints, each attempt's logs and
termination reports, report.json (the status the CR would have), the recorded series and the plot.
What the run records there (the status, the series, the GPU time) has one owner, `RunRecord`
(`localrun.record`), whether a trainer's line comes live or from a killed runner's log; this
module runs the attempts, follows their lines and shows them.

Charging (mpjob.planning.charging): no cluster here, so the only stop from outside a trainer is
the user's (Ctrl-C, or the runner killed: `leftover`): the attempt ends Suspended, uncharged, as
under runPolicy.suspend. Whatever a trainer does by itself (exit 44 included) is charged, as on
a cluster that shows no disruption; in GPU-seconds only when its trainers ran on a GPU (`cost`).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
from functools import reduce
from pathlib import Path
from typing import TYPE_CHECKING

from mpjob.localrun import rerun, stops
from mpjob.localrun.elastic import CapacityWatch, WorkersSchedule, unschedulable
from mpjob.localrun.launching import attempt_env, checkpoint_dir, working_dir, working_dir_gone
from mpjob.localrun.paths import Paths
from mpjob.localrun.readings import noted, reached
from mpjob.localrun.record import LOCAL_CAPABILITY, RunRecord
from mpjob.localrun.recoveries import RecoveryClock
from mpjob.localrun.rendezvous import Rendezvous
from mpjob.localrun.series import RunSeries
from mpjob.localrun.stall import DeadlineWatch, StallWatch
from mpjob.localrun.waiting import past_due, wait_out
from mpjob.localrun.workers import Workers, lines
from mpjob.planning import lifecycle as lc
from mpjob.planning.backoff import JOB_CONTROLLER, RetryBackoff
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.elastic import room_after
from mpjob.planning.inplace import in_place_plan
from mpjob.planning.phases import past_deadline
from mpjob.planning.planner import StartAttempt, first_attempt
from mpjob.planning.reconcile import FINISHED
from mpjob.planning.reported import without_progress
from mpjob_contract import events
from mpjob_contract.api import MixedPrecisionJob, MixedPrecisionJobStatus, processes_per_worker
from mpjob_contract.codes import Reason

if TYPE_CHECKING:  # rich (the `local` extra) loads with the view, not with the runner
    from mpjob.localrun.progress import ProgressView


class LocalRun:
    def __init__(
        self,
        job: MixedPrecisionJob,
        out: Path,
        view: ProgressView,
        *,
        base_dir: Path | None = None,
        python: str = sys.executable,
        schedule: WorkersSchedule | None = None,
        notes: tuple[tuple[str, str], ...] = (),
        retries: RetryBackoff = JOB_CONTROLLER,
    ) -> None:
        self.job, self.retries = job, retries  # retries: the wait before an attempt that retries a failure
        #: The manifest's folder: a `task.command` runs there (or in its workingDir below it).
        self.base_dir = (base_dir or Path.cwd()).resolve()
        self.spec = job.spec
        self.name = job.metadata.name
        self.paths = Paths(out)
        self.view = view
        self.notes = notes  # (field, line) said once an attempt will start: none for a run that starts none
        self.python = python
        self.ctrl_c = stops.CtrlC(view)  # the user's stop: checkpoint and stop, or killed (`stops`)
        self._workers: Workers | None = None
        #: --workers-available: the simulated cluster's capacity (None: always spec.workers).
        self.schedule = schedule
        self._watches: list[CapacityWatch | StallWatch | DeadlineWatch] = []  # see the attempt's events, may stop it
        #: Where this run's trainers keep checkpoints (localrun.launching.checkpoint_dir).
        self.checkpoint_dir = checkpoint_dir(job, self.paths)
        self.record = RunRecord(self.spec, self.paths, self.checkpoint_dir)  # status, series, GPU time
        #: The attempt the trainers train now: the launched one, or one they changed to in place.
        self._current: StartAttempt | None = None
        self._reached: int | None = None  # the step the current attempt's lines put it at
        self._clock = RecoveryClock()

    @property
    def status(self) -> MixedPrecisionJobStatus:
        """The run's status as it stands (report.json's once saved)."""
        return self.record.status

    @property
    def series(self) -> RunSeries:
        return self.record.series

    # ------------------------------------------------------------------ the plan
    def run(self) -> MixedPrecisionJobStatus:
        """Attempt after attempt, through the operator's lifecycle (mpjob.planning.lifecycle)."""
        self.paths.root.mkdir(parents=True, exist_ok=True)
        with self.ctrl_c.caught():  # between attempts too: a stop then ends the run before the next one
            start = self._resume_or_start()
            for field, line in self.notes if start is not None else ():
                self.view.info(line, field=field)
            while start is not None:
                wait_out(
                    self.spec, self.status, self.retries, view=self.view, ctrl_c=self.ctrl_c, save=self.record.save
                )
                self._current, self._reached = None, None  # set once it starts: one that never ran ends as itself
                held = self.ctrl_c.held_back() or past_due(self.spec, self.status)
                cannot = unschedulable(self.spec, self.schedule, start) or working_dir_gone(self.spec, self.base_dir)
                outcome = held or cannot or self._run_attempt(start)
                start = self._conclude(self._current or start, outcome)
        self.record.save()
        return self.status

    def _resume_or_start(self) -> StartAttempt | None:
        """The first attempt, or the one that follows what an earlier `mpjob run` of --out left;
        none under runPolicy.suspend, as the operator starts none."""
        reopened = False
        if self.record.take_over():
            reopened = rerun.reopens(self.status)  # ended on a configuration error: fixed, it goes on
            if self.status.phase in FINISHED and not reopened:  # left as it ended: this rerun runs nothing
                self.view.info(stops.ended_line(self.paths.report, self.status, self.spec.training.steps))
                return None
            self.status.total_steps = self.spec.training.steps  # what every step a trainer names is held to
            if self.status.attempts and self.status.attempts[-1].finish_time is None:  # the runner was killed
                ended = self.record.end_killed()
                self.view.attempt_ended(ended.index, ended.precision, Reason.SUSPENDED.value, ended.message or "")
        plan, when = self.record.transition()
        if not self.status.attempts:  # a new run, or one suspended before its first attempt
            lc.created(plan, when, f"local run in {self.paths.root}")
        if self.spec.run_policy.suspend:
            self.view.info(stops.held(plan, when, self.paths.root))
            return None
        if not self.status.attempts:
            lc.begin(plan, self.spec, first_attempt(self.spec, LOCAL_CAPABILITY), when)
            return plan.create[0]
        if reopened:
            rerun.reopen(plan, self.spec, when)
        else:
            lc.resume(plan, self.spec, when, outlive=True)  # its checkpoints: a folder on disk
        self.record.account()
        if not plan.create:
            return None
        said = rerun.rerun_line if reopened else stops.resume_line
        self.view.info(said(self.name, self.paths.root, self.status.last_checkpoint))
        return plan.create[0]

    def _stopped(self, index: int, outcome: AttemptOutcome) -> str | None:
        """The message of attempt `index` if the user stopped it (None: not stopped); one a second
        Ctrl-C killed before its trainers reported, or whose report carries no progress (its ranks
        killed by the SIGTERM before they trained), ends where it was seen, naming the checkpoint known.
        One whose trainers had trained every step (a stop at the last step or during its final
        checkpoint: they end Succeeded) was not stopped: it ends as they say, the job Succeeded."""
        if self.ctrl_c.stop is stops.Stop.NONE:
            return None
        if outcome.report is not None and outcome.report.reason == Reason.SUCCEEDED:
            return None
        if outcome.report is None or without_progress(self.status, index, outcome.report):
            self.record.ends_where_seen(self._reached)
        checkpoint, started = self.status.last_checkpoint, self._current is not None
        return stops.stop_message(self.ctrl_c.stop, outcome.report, checkpoint, started=started, by=self.ctrl_c.by)

    def _conclude(self, start: StartAttempt, outcome: AttemptOutcome) -> StartAttempt | None:
        """End the attempt as the operator would; Ctrl-C suspends the run instead of going on."""
        stopped = self._stopped(start.index, outcome)
        plan, when = self.record.transition()
        if stopped is not None:
            lc.interrupt(plan, start.index, outcome.report, when, message=stopped)
        elif self._current is None and outcome.platform_reason == Reason.DEADLINE_EXCEEDED:  # `past_due`
            past_deadline(plan, self.spec, when, outlive=True)  # never started: as the operator ends it
        else:
            fits = None if self.schedule is None else self.schedule.now()  # as the operator reads the cluster's
            entry = next(a for a in plan.status.attempts if a.index == start.index)
            lc.conclude(
                plan,
                self.spec,
                attempt=start,
                outcome=outcome,
                when=when,
                capability=LOCAL_CAPABILITY,
                checkpoint_dir=self.checkpoint_dir,
                outlive=True,
                room=room_after(self.spec, plan.status, entry, outcome, fits),
            )
        self.record.account()
        ended = next(a for a in self.status.attempts if a.index == start.index)
        self.series.end_attempt(start.index, ended.end_step or 0, ended.reason or "")
        self.view.attempt_ended(start.index, ended.precision, ended.reason or "", ended.message or "")
        for src, dst in [*plan.fallbacks, *plan.repromotions]:
            self.view.fallback(src, dst, plan.create[0].start_step, ended.reason or "")
        self.record.save()
        return plan.create[0] if plan.create else None

    # ------------------------------------------------------------------ one attempt
    def _run_attempt(self, start: StartAttempt) -> AttemptOutcome:
        """One attempt as the cluster runs it: a launcher per worker (a pod each), each starting
        processesPerWorker training processes."""
        folder = self.paths.attempt(start.index)
        folder.mkdir(parents=True, exist_ok=True)
        lc.running(*self.record.transition())
        self.series.begin_attempt(start.index, start.precision, start.start_step)
        self.view.attempt_started(start.index, start.precision, start.start_step, start.resume_from)
        self.record.save()
        count, cwd = start.workers or self.spec.workers, working_dir(self.spec, self.base_dir)
        self._workers = Workers(self.spec, folder=folder, cwd=cwd, python=self.python, count=count)
        self._watches = [StallWatch(self.spec, self._workers), DeadlineWatch(self.spec, self.status, self._workers)]
        if self.schedule is not None:  # before the deadline's, which outranks a resize as on a cluster
            self._watches.insert(1, CapacityWatch(self.spec, self.schedule, start, self._workers, self.status))
        self._current, self._reached = start, None
        self.record.gpu_time.begin(count)
        in_place = in_place_plan(self.spec, start, self.status, LOCAL_CAPABILITY)
        meet = Rendezvous(count * processes_per_worker(self.spec))
        env, container = attempt_env(
            self.job, start, checkpoint_dir=self.checkpoint_dir, in_place=in_place, rendezvous=meet.env()
        )
        worker0 = self._workers.start(env, container)
        with self.ctrl_c.caught(self._workers), contextlib.closing(meet):
            try:
                meet.serve()
                self._follow(worker0, self._workers.log0)
            except Exception:  # no store to meet at, a log or report unwritten: the runner stops, its trainers too
                self._workers.signal(signal.SIGKILL)
                raise
            finally:
                outcome = self._workers.wait(start.index)
        self.record.gpu_time.charge((self._current or start).index)  # an attempt changed in place: the newest
        return reduce(lambda said, watch: watch.ended(said), self._watches, outcome)  # a watch that stopped it says how

    def _follow(self, proc: subprocess.Popen[str], log: object) -> None:
        """Worker 0's lines until it ends."""
        assert proc.stdout is not None
        for line in lines(proc.stdout):
            log.write(line)  # type: ignore[attr-defined]
            if (event := events.parse_line(line)) is not None:
                self._event(event)

    def _event(self, event: events.TrainerEvent) -> None:
        """What one trainer line changes in the status and the series, and what the view shows of it."""
        start = self._current
        assert start is not None  # set before the workers start
        point, news = self.record.absorb(start.index, start.precision, event)
        if news is not None:  # the operator's Resumed or CheckpointsFailing Event: resumed elsewhere, saves lapsed
            self.view.info(news)
        if point is not None:
            self.view.step(point)
        self._clock.seen(self.status, start.index, event)
        self._reached = reached(self._reached, event)
        for watch in self._watches:
            watch.seen(event)
        if isinstance(event, events.PrecisionChanged):
            self._changed_in_place(event)
        if (note := noted(event)) is not None:
            self.view.info(note)

    def _changed_in_place(self, line: events.PrecisionChanged) -> None:
        """The trainers changed precision or micro-batch in their processes: the attempt ends and
        the next one begins, once (`RunRecord.change_in_place`), shown as it happens."""
        charging = None if self._current is None else self._current.index
        if (changed := self.record.change_in_place(line, charging=charging)) is None:
            return
        ended, nxt, reason = changed.ended, changed.nxt, changed.reason
        self.view.attempt_ended(ended.index, ended.precision, reason, changed.change.message)
        if changed.change.kind == "microBatch":
            split = f"micro-batch {ended.micro_batch} -> {nxt.micro_batch} x {nxt.grad_accumulation}"
            self.view.info(f"{split} at step {nxt.start_step} in place ({reason})")
        else:
            self.view.fallback(ended.precision, nxt.precision, nxt.start_step, reason)
            if nxt.micro_batch is not None and nxt.micro_batch != ended.micro_batch:  # a split taken back
                was = f"{ended.micro_batch} x {ended.grad_accumulation}"
                self.view.info(f"micro-batch {was} -> {nxt.micro_batch} x {nxt.grad_accumulation} in place")
        self._current = nxt
        self.view.attempt_started(nxt.index, nxt.precision, nxt.start_step, f"step {nxt.start_step} in place")
