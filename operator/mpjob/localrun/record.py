"""What a local run records in its folder (`Paths`): the status report.json holds (what the CR
would, as the operator writes it), the recorded series and the GPU time charged. One owner for
the three, so that a trainer's line changes them the same way whether the runner sees it live or
replays it from the log a killed runner left (`leftover`), and they are saved together.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from mpjob.localrun import leftover
from mpjob.localrun.gpu_time import GpuTime
from mpjob.localrun.paths import Paths
from mpjob.localrun.readings import reached, reading_of
from mpjob.localrun.series import Point, RunSeries
from mpjob.planning import changed, cost, history
from mpjob.planning import lifecycle as lc
from mpjob.planning import status as st
from mpjob.planning.observe import observe
from mpjob.planning.plan import Plan, When
from mpjob.planning.planner import StartAttempt
from mpjob_contract import events
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobSpec, MixedPrecisionJobStatus
from mpjob_contract.codes import Reason
from mpjob_contract.report import InPlaceChange

#: A CPU machine: `auto` resolves as on a node without GPUs.
LOCAL_CAPABILITY = None


def of_line(line: events.PrecisionChanged) -> InPlaceChange | None:
    """A `precisionChanged` line as the change it names; None when it names none it could."""
    try:
        return InPlaceChange.model_validate(line.model_dump(by_alias=True))
    except ValidationError:
        return None


@dataclass(frozen=True)
class ChangedInPlace:
    """A change of precision or micro-batch the trainers made in their processes, recorded: the
    attempt it `ended` (for the `reason`) and the attempt `nxt` it began."""

    ended: AttemptStatus
    nxt: StartAttempt
    change: InPlaceChange
    reason: str


class RunRecord:
    """The status, series and GPU time of the run in `paths`, for `spec`, whose trainers keep
    checkpoints in `checkpoint_dir`."""

    def __init__(self, spec: MixedPrecisionJobSpec, paths: Paths, checkpoint_dir: str) -> None:
        self.spec, self.paths, self.checkpoint_dir = spec, paths, checkpoint_dir
        self.status = MixedPrecisionJobStatus(total_steps=spec.training.steps)
        self.series = RunSeries()
        #: GPU-seconds of the attempts run here: the GPUs their workers ran on x their wall time.
        self.gpu_time = GpuTime(spec)

    def take_over(self) -> bool:
        """Load what an earlier `mpjob run` of the same --out left, if it left a status."""
        if (earlier := self.paths.earlier_status()) is None:
            return False
        self.status, self.series = earlier, RunSeries.load(self.paths.series)
        return True

    def transition(self) -> tuple[Plan, When]:
        """A change of the status, as the operator's lifecycle makes one, now."""
        return Plan(status=self.status), When(st.now())

    def account(self) -> None:
        """The attempts' cost (GPU-seconds, charged or not) into the status."""
        cost.account(self.status, self.spec, self.gpu_time.seconds)

    def absorb(self, index: int, precision: str, event: events.TrainerEvent) -> tuple[Point | None, str | None]:
        """What one trainer line changes in the status (`planning/observe.py` decides, as for the
        operator's reads) and the series; live, or replayed from a killed run's log. The step
        point to show, and the news the operator makes an Event of (a corrected start step, the
        CheckpointsFailing condition's flip)."""
        point, news = self.series.ingest(index, precision, event), None
        self.series.ingest_eval(index, event)
        self.series.ingest_skip(index, event)
        if (reading := reading_of(index, event)) is not None:
            seen = observe(self.status, reading, every_steps=self.spec.checkpoint.every_steps)
            self.status, news = seen.status, "\n".join(seen.lines()) or None
        if isinstance(event, events.PrecisionMeasured):
            self.series.measured(index, event.chosen)
        self.gpu_time.seen(event)  # what it is charged
        return point, news

    def change_in_place(self, line: events.PrecisionChanged, *, charging: int | None) -> ChangedInPlace | None:
        """The trainers changed precision or micro-batch in their processes (a fallback, a
        re-promotion, a split): the attempt ends and the next one begins, once. `charging`: the
        attempt whose GPU time ends here (None: a replay, whose time the log tells). None: not a
        change the trainer could have made (the attempt's end will tell), or one already recorded."""
        ended, change = self.status.attempts[-1], of_line(line)
        if change is None:
            return None
        if charging is not None:
            self.gpu_time.charge(charging)
        plan, when = self.transition()
        local = {"capability": LOCAL_CAPABILITY, "checkpoint_dir": self.checkpoint_dir}
        if (nxt := changed.record(plan, self.spec, [change], when, **local)) is None:  # type: ignore[arg-type]
            return None
        self.account()
        reason = changed.ENDED_BY[change.kind][0].value
        self.series.end_attempt(ended.index, change.step, reason)
        self.series.begin_attempt(nxt.index, nxt.precision, nxt.start_step)
        self.save()
        return ChangedInPlace(ended, nxt, change, reason)

    def end_killed(self) -> AttemptStatus:
        """End the attempt a killed runner left running from the event lines it left (`leftover`):
        where it began, the steps it trained, the checkpoints it committed; as Ctrl-C ends one.
        One it was killed before starting (no log) ends where it was to begin, said so. The
        attempt ended (the replay's copy, its start step corrected)."""
        attempt = self.status.attempts[-1]
        owner = next(a for a in self.status.attempts if a.index == history.job_index(self.status, attempt.index))
        folder = self.paths.attempt(owner.index)  # one begun in place: its chain's
        said = leftover.KILLED if leftover.started(folder) else leftover.KILLED_UNSTARTED
        logged = leftover.logged_events(folder)
        for index, precision, event in leftover.attributed(logged, owner.index, owner.precision):
            if isinstance(event, events.PrecisionChanged):
                self.change_in_place(event, charging=None)
            self.absorb(index, precision, event)
        self.ends_where_seen(leftover.reached_step(logged))
        current = self.status.attempts[-1]
        plan, when = self.transition()
        lc.interrupt(plan, current.index, None, when, message=said)
        workers = self.status.workers or self.spec.workers
        self.gpu_time.charge_seen(current.index, workers, leftover.seconds_seen(current.start_time, logged))
        self.series.end_attempt(current.index, self.status.step, Reason.SUSPENDED.value)
        return current

    def ends_where_seen(self, seen: int | None) -> None:
        """A killed attempt (no report) ends where its lines put it (`seen`; None: where it began),
        or at a checkpoint committed on disk after them whose line never came, taken in as that line."""
        current = self.status.attempts[-1]
        known = self.status.last_checkpoint.step if self.status.last_checkpoint else -1
        if (unlogged := leftover.committed_after(self.paths.checkpoints, known)) is not None:
            self.absorb(current.index, current.precision, unlogged)
            seen = reached(seen, unlogged)
        self.status.step = current.start_step if seen is None else seen

    def save(self) -> None:
        """report.json and the series, as they stand."""
        self.paths.save_report(self.status)
        self.series.save(self.paths.series)
