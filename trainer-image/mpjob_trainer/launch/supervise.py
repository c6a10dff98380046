"""Run the local ranks: start them, pass signals on, stop siblings of a failed rank, reap.

One thread, no polling: SIGTERM, SIGINT and SIGCHLD land in a socket (signal.set_wakeup_fd)
and the loop sleeps in select() until one arrives or the sibling grace period ends. The
handlers are installed before the first child starts, so no ending and no stop request is
lost. Children are reaped with waitpid(-1): as a container's PID 1 the launcher also reaps
orphans the trainer's own subprocesses leave behind.

Each child runs in its own session (process group): a terminal's Ctrl-C reaches only the
launcher, which passes it on once, so no rank sees it twice, and stop signals go to the
rank's main process only (not to its DataLoader workers, which would turn a checkpointing
stop into a crash), as kubelet's SIGTERM reaches only PID 1. SIGKILL goes to the whole
group, so nothing a rank started outlives it. On Linux each child also dies with the
launcher (PR_SET_PDEATHSIG), because whoever kills the launcher's group no longer reaches them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from mpjob_contract.codes import ExitCode, Reason
from mpjob_contract.report import TerminationReport
from mpjob_trainer.launch.fold import RankEnding, rank_ending
from mpjob_trainer.launch.plan import LaunchPlan

#: Signals passed on to every running rank, as received.
FORWARDED = (signal.SIGTERM, signal.SIGINT)
#: How long the siblings of a failed rank get to end by themselves before SIGTERM.
SETTLE_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1


def say(message: str) -> None:
    """The launcher's own lines go to stderr: stdout carries the trainer's JSON events."""
    print(f"mpjob-launch: {message}", file=sys.stderr, flush=True)


@dataclass
class LocalRank:
    local_rank: int
    rank: int
    report_path: Path
    pid: int = 0  # 0 until started
    returncode: int | None = None
    stopped: bool = False
    order: int = 0
    start_error: TerminationReport | None = None

    @property
    def running(self) -> bool:
        return self.pid > 0 and self.returncode is None

    def ending(self) -> RankEnding:
        assert self.returncode is not None
        if self.start_error is not None:
            return RankEnding(self.local_rank, self.rank, self.returncode, self.start_error, self.stopped, self.order)
        message = _read_text(self.report_path)
        return rank_ending(
            self.local_rank, self.rank, self.returncode, message=message, stopped=self.stopped, order=self.order
        )


#: A rank's report file is read this far at most (a valid one is under 4 KiB).
REPORT_READ_LIMIT = 16384


def _read_text(path: Path) -> str | None:
    try:
        with path.open(errors="replace") as report:
            return report.read(REPORT_READ_LIMIT)
    except OSError:
        return None


@contextlib.contextmanager
def signal_inbox() -> Iterator[socket.socket]:
    """A socket that receives one byte per signal (its number) for FORWARDED and SIGCHLD."""
    receive, send = socket.socketpair()
    receive.setblocking(False)
    send.setblocking(False)
    watched = (*FORWARDED, signal.SIGCHLD)
    previous = {sig: signal.getsignal(sig) for sig in watched}

    def noted(signum: int, frame: FrameType | None) -> None:
        """The byte in the socket is the news; the loop acts on it."""

    old_fd = signal.set_wakeup_fd(send.fileno(), warn_on_full_buffer=False)
    try:
        for sig in watched:
            signal.signal(sig, noted)
        yield receive
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        signal.set_wakeup_fd(old_fd)
        receive.close()
        send.close()


def _die_with_parent() -> Callable[[], None] | None:
    """preexec_fn: SIGKILL this child when the launcher dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the launcher died before the line above
            os._exit(int(ExitCode.INFRA_ERROR))

    return arm


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
    rank.returncode = int(code)
    rank.start_error = TerminationReport(reason=reason, message=message)
    say(message)


class Supervisor:
    """Starts the plan's local ranks and watches them until every one has ended.

    When a rank fails by itself, its siblings get SETTLE_SECONDS to end on their own (ranks
    that took the same collective decision end within moments; a SIGTERM would hit them while
    they write their reports), then SIGTERM (the trainer checkpoints and exits 44), then
    SIGKILL once the plan's grace period has passed. After an outside SIGTERM/SIGINT the
    launcher sets no deadline of its own: the sender (kubelet) owns it.
    """

    def __init__(self, plan: LaunchPlan, env: Mapping[str, str], report_dir: Path) -> None:
        self.plan = plan
        self.env = env
        self.ranks = [
            LocalRank(i, plan.global_rank(i), report_dir / f"rank-{plan.global_rank(i)}.json")
            for i in range(plan.nproc)
        ]
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self.told_to_stop = False
        self.failed: LocalRank | None = None
        #: Sibling stop deadlines (time.monotonic()): SIGTERM at term_at, SIGKILL at kill_at.
        self.term_at: float | None = None
        self.kill_at: float | None = None

    def run(self) -> list[RankEnding]:
        """Start, watch and reap every local rank; their endings, by local rank."""
        with signal_inbox() as inbox:
            try:
                self._start_all()
                while True:
                    self._reap()
                    self._notice_a_failed_rank()
                    self._stop_siblings_on_time()
                    if not self._running():
                        break
                    for signum in self._wait(inbox):
                        self._forward(signum)
            finally:
                self._kill_remaining()
        return [rank.ending() for rank in self.ranks]

    def _running(self) -> list[LocalRank]:
        return [rank for rank in self.ranks if rank.running]

    def _start_all(self) -> None:
        preexec = _die_with_parent()
        for rank in self.ranks:
            env = self.plan.rank_env(rank.local_rank, self.env, str(rank.report_path))
            try:
                proc = subprocess.Popen(list(self.plan.command), env=env, start_new_session=True, preexec_fn=preexec)
            except OSError as exc:
                _start_failure(rank, self.plan.command[0], exc)
                continue
            rank.pid = proc.pid
            self._procs[proc.pid] = proc
            say(f"rank {rank.rank} (local {rank.local_rank}, world {self.plan.world_size}) started: pid {proc.pid}")

    def _wait(self, inbox: socket.socket) -> list[int]:
        """Sleep until a signal arrives or the next deadline; the signals that arrived."""
        deadlines = [t for t in (self.term_at, self.kill_at) if t is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        select.select([inbox], [], [], timeout)
        received = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := inbox.recv(4096):
                received += chunk
        return list(received)

    def _forward(self, signum: int) -> None:
        if signum not in FORWARDED:
            return  # SIGCHLD: the next reap picks the ending up
        sig = signal.Signals(signum)
        self.told_to_stop = True
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
            proc = self._procs.get(pid)
            if proc is None:
                continue  # an orphan this PID 1 adopted: reaped, nothing else to do
            proc.returncode = os.waitstatus_to_exitcode(status)
            rank = next(r for r in self.ranks if r.pid == pid)
            rank.returncode = proc.returncode
            rank.order = sum(r.returncode is not None for r in self.ranks) - 1
            say(f"rank {rank.rank} {RankEnding(rank.local_rank, rank.rank, proc.returncode).how}")

    def _notice_a_failed_rank(self) -> None:
        """A rank that fails by itself leaves its siblings blocked in collectives: plan their stop."""
        if self.told_to_stop or self.failed is not None:
            return
        self.failed = next((r for r in self.ranks if r.returncode not in (None, 0)), None)
        if self.failed is None or not self._running():
            return
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
            rank.returncode = self._procs[rank.pid].wait()
