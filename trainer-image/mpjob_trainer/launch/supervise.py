"""Run the local ranks: start them, pass signals on, stop siblings of a failed rank, reap.

One thread, no polling: SIGTERM, SIGINT and SIGCHLD land in a pipe (launch.signals, whose
handlers `main` installs before anything else) and the loop sleeps in select() until one
arrives, a rank's stderr has something to pass on (launch.tee), or the sibling grace period
ends. A stop that arrived before the ranks start is found in the inbox first: then no rank
is started. Children are reaped with waitpid(-1): as a container's PID 1 the launcher also
reaps orphans the trainer's own subprocesses leave behind.

Each child runs in its own session (process group): a terminal's Ctrl-C reaches only the
launcher, which passes it on once, so no rank sees it twice, and stop signals go to the
rank's main process only (not to its DataLoader workers, which would turn a checkpointing
stop into a crash), as kubelet's SIGTERM reaches only PID 1. SIGKILL goes to the whole
group, so nothing a rank started outlives it. On Linux each child also dies with the
launcher (PR_SET_PDEATHSIG), because whoever kills the launcher's group no longer reaches them.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence

from mpjob_contract.codes import ExitCode, Reason
from mpjob_trainer.launch.exits import RankExit, StartError, how
from mpjob_trainer.launch.plan import LaunchPlan
from mpjob_trainer.launch.reports import read_report
from mpjob_trainer.launch.script import missing_script
from mpjob_trainer.launch.signals import FORWARDED, Inbox, received, say, stop_received
from mpjob_trainer.launch.spawn import spawn
from mpjob_trainer.launch.tee import Tee

#: How long the siblings of a failed rank get to end by themselves before SIGTERM.
SETTLE_SECONDS = 1.0


class LocalRank:
    """One local rank as the supervisor tracks it (a plain class: see launch.exits on dataclasses)."""

    def __init__(self, local_rank: int, rank: int, report_path: str) -> None:
        self.local_rank, self.rank, self.report_path = local_rank, rank, report_path
        self.pid = 0  # 0 until started
        self.returncode: int | None = None
        self.stopped = False
        self.order = 0
        self.start_error: StartError | None = None
        self.tee: Tee | None = None

    @property
    def running(self) -> bool:
        return self.pid > 0 and self.returncode is None

    def ending(self) -> RankExit:
        assert self.returncode is not None
        return self._exit(self.returncode, self.stopped, self.order)

    def _exit(self, returncode: int, stopped: bool, order: int) -> RankExit:
        return RankExit(
            self.local_rank,
            self.rank,
            returncode,
            report_text=None if self.start_error is not None else read_report(self.report_path),
            stopped=stopped,
            order=order,
            stderr_tail=self.tee.tail.text() if self.tee is not None else "",
            start_error=self.start_error,
        )


def _send(pid: int, sig: signal.Signals, *, group: bool = False) -> None:
    """Signal a rank not yet reaped (its pid, and its group id, cannot have been reused)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _start_failure(rank: LocalRank, command: str, exc: OSError) -> None:
    """A command that cannot be started is the user's to fix (43); anything else is infra (1)."""
    user_error = isinstance(exc, FileNotFoundError | PermissionError | NotADirectoryError)
    reason, code = (Reason.CONFIG_ERROR, ExitCode.CONFIG_ERROR) if user_error else (Reason.INFRA_ERROR, 1)
    message = f"local rank {rank.local_rank} (rank {rank.rank}) could not start {command!r}: {exc.strerror or exc}"
    _refused(rank, reason, code, message)


def _refused(rank: LocalRank, reason: Reason, code: ExitCode | int, message: str) -> None:
    """`rank` ends unstarted, as `reason` and `code` say, for the fold to report."""
    rank.returncode = int(code)
    rank.start_error = StartError(reason, int(code), message)
    say(message)


def _not_started(rank: LocalRank, sig: signal.Signals) -> None:
    """A stop that came before the ranks started: none is started; the pod ends Preempted (44)."""
    rank.returncode, rank.stopped = int(ExitCode.PREEMPTED), True
    message = f"{sig.name} received before local rank {rank.local_rank} (rank {rank.rank}) started: not started"
    rank.start_error = StartError(Reason.PREEMPTED, int(ExitCode.PREEMPTED), message)


class Supervisor:
    """Starts the plan's local ranks and watches them until every one has ended.

    When a rank fails by itself, its siblings get SETTLE_SECONDS to end on their own (ranks
    that took the same collective decision end within moments; a SIGTERM would hit them while
    they write their reports), then SIGTERM (the trainer checkpoints and exits 44), then
    SIGKILL once the plan's grace period has passed. After an outside SIGTERM/SIGINT the
    launcher sets no deadline of its own: the sender (kubelet) owns it.

    From the moment it begins stopping ranks (either way) until they have all ended, it hands
    `on_stopping` the endings of those that have ended, how many ranks it has and why it stops,
    again each time one more has ended (launch.provisional).
    """

    def __init__(
        self,
        plan: LaunchPlan,
        env: Mapping[str, str],
        report_dir: str,
        inbox: Inbox,
        on_stopping: Callable[[Sequence[RankExit], int, str], None] | None = None,
    ) -> None:
        self.plan = plan
        self.env = env
        self.inbox = inbox
        self.on_stopping = on_stopping
        self.ranks = [
            LocalRank(i, plan.global_rank(i), os.path.join(report_dir, f"rank-{plan.global_rank(i)}.json"))
            for i in range(plan.nproc)
        ]
        self.told_to_stop = False
        self.failed: LocalRank | None = None
        #: Why the launcher stops its ranks (None: it does not), and how many had ended when it
        #: last handed their endings to `on_stopping` (None: not yet).
        self.stopping: str | None = None
        self.told_at: int | None = None
        #: Sibling stop deadlines (time.monotonic()): SIGTERM at term_at, SIGKILL at kill_at.
        self.term_at: float | None = None
        self.kill_at: float | None = None

    def run(self) -> list[RankExit]:
        """Start, watch and reap every local rank; their endings, by local rank."""
        early = stop_received(self.inbox)
        if early is not None:
            say(f"{early.name} received before any rank started: starting none")
            for rank in self.ranks:
                _not_started(rank, early)
            return [rank.ending() for rank in self.ranks]
        try:
            self._start_all()
            while True:
                self._reap()
                self._notice_a_failed_rank()
                self._stop_siblings_on_time()
                if not self._running():
                    break
                self._tell_stopping()
                for signum in self._wait():
                    self._forward(signum)
        finally:
            self._kill_remaining()
            self._drain_stderr()
        return [rank.ending() for rank in self.ranks]

    def _running(self) -> list[LocalRank]:
        return [rank for rank in self.ranks if rank.running]

    def _tell_stopping(self) -> None:
        """While ranks are being stopped: their endings so far, when more have ended than last told."""
        ended = sum(rank.returncode is not None for rank in self.ranks)
        if self.stopping is None or self.on_stopping is None or ended == self.told_at:
            return
        self.told_at = ended
        self.on_stopping(
            [rank.ending() for rank in self.ranks if rank.returncode is not None], len(self.ranks), self.stopping
        )

    def _start_all(self) -> None:
        """Start every rank; none when the command is python with a script that is not there
        (launch.script: python would exit 2 with no report, read as an infrastructure failure)."""
        missing = missing_script(self.plan.command, os.getcwd())
        for rank in self.ranks:
            if missing is not None:
                where = f"local rank {rank.local_rank} (rank {rank.rank})"
                _refused(rank, Reason.CONFIG_ERROR, ExitCode.CONFIG_ERROR, f"{where} not started: {missing}")
                continue
            env = self.plan.rank_env(rank.local_rank, self.env, rank.report_path)
            try:
                started = spawn(self.plan.command, env)
            except OSError as exc:
                _start_failure(rank, self.plan.command[0], exc)
                continue
            rank.pid, rank.tee = started.pid, Tee(started.stderr)
            say(f"rank {rank.rank} (local {rank.local_rank}, world {self.plan.world_size}) started: pid {rank.pid}")

    def _wait(self) -> list[int]:
        """Sleep until a signal arrives, a rank writes to stderr or the next deadline; the signals."""
        deadlines = [t for t in (self.term_at, self.kill_at) if t is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        tees = {rank.tee.fd: rank.tee for rank in self.ranks if rank.tee is not None and rank.tee.fd is not None}
        signals, readable = received(self.inbox, list(tees), timeout)
        for fd in readable:
            tees[fd].pump()
        return signals

    def _drain_stderr(self) -> None:
        """What the ranks wrote last; a pipe a rank's orphan still holds is not waited for."""
        for rank in self.ranks:
            if rank.tee is not None:
                rank.tee.pump()
                rank.tee.close()

    def _forward(self, signum: int) -> None:
        if signum not in FORWARDED:
            return  # SIGCHLD: the next reap picks the ending up
        sig = signal.Signals(signum)
        self.told_to_stop = True
        self.stopping = self.stopping or f"{sig.name} received"
        running = self._running()
        say(f"{sig.name} received: passing it on to {len(running)} running local rank(s)")
        for rank in running:
            rank.stopped = True
            _send(rank.pid, sig)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rank = next((r for r in self.ranks if r.running and r.pid == pid), None)
            if rank is None:
                continue  # an orphan this PID 1 adopted: reaped, nothing else to do
            rank.returncode = os.waitstatus_to_exitcode(status)
            rank.order = sum(r.returncode is not None for r in self.ranks) - 1
            say(f"rank {rank.rank} {how(rank.returncode)}")

    def _notice_a_failed_rank(self) -> None:
        """A rank that fails by itself leaves its siblings blocked in collectives: plan their stop."""
        if self.told_to_stop or self.failed is not None:
            return
        self.failed = next((r for r in self.ranks if r.returncode not in (None, 0)), None)
        if self.failed is None or not self._running():
            return
        self.stopping = f"rank {self.failed.rank} failed"
        settle = min(SETTLE_SECONDS, self.plan.grace_seconds)
        self.term_at = time.monotonic() + settle
        say(f"rank {self.failed.rank} failed: SIGTERM to the others if still running in {settle:g}s")

    def _stop_siblings_on_time(self) -> None:
        now = time.monotonic()
        if self.term_at is not None and now >= self.term_at:
            self.term_at, self.kill_at = None, now + self.plan.grace_seconds
            for rank in self._running():
                say(f"rank {rank.rank}: SIGTERM (SIGKILL in {self.plan.grace_seconds:g}s)")
                rank.stopped = True
                _send(rank.pid, signal.SIGTERM)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            for rank in self._running():
                say(f"rank {rank.rank} still running {self.plan.grace_seconds:g}s after SIGTERM: SIGKILL")
                _send(rank.pid, signal.SIGKILL, group=True)

    def _kill_remaining(self) -> None:
        """Only after an error in the launcher itself: leave no rank behind."""
        for rank in self._running():
            _send(rank.pid, signal.SIGKILL, group=True)
            rank.returncode = os.waitstatus_to_exitcode(os.waitpid(rank.pid, 0)[1])
