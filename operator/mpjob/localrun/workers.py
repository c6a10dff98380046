"""An attempt's workers on this machine: one `mpjob-launch` process per worker, each standing
in for a pod. The launcher starts the worker's processesPerWorker training processes and folds
their endings into one exit code and termination file; these are read back as the operator
reads pods, so the same rule picks the worker that explains the attempt."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import IO

from mpjob.builders.attempt import launcher_argv
from mpjob.builders.expansion import expanded
from mpjob.localrun.files import created, read_regular
from mpjob.planning import cutoff
from mpjob.planning.classify import AttemptOutcome
from mpjob.planning.reconcile import JobView, PodView, outcome_of
from mpjob_contract.api import MixedPrecisionJobSpec
from mpjob_contract.report import MAX_REPORT_BYTES, TERMINATION_LOG_ENV

#: A task.command that starts with one of these runs in `mpjob run`'s own interpreter, as
#: torchrun starts `python` with sys.executable: `mpjob run` called by its path, with its
#: environment not on PATH, still trains with the torch and mpjob_trainer it was installed with.
PYTHON_NAMES = frozenset({"python", "python3"})


def with_interpreter(argv: list[str], python: str) -> list[str]:
    """The launcher's argv with the command's `python`/`python3` (after `--`) made `python`."""
    cut = argv.index("--") + 1
    command = argv[cut:]
    if command and command[0] in PYTHON_NAMES:
        command = [python, *command[1:]]
    return [*argv[:cut], *command]


#: The longest the runner's main thread waits for worker 0's next line at a time (`lines`).
WAKE_SECONDS = 0.5
#: The most characters of one line held at once (`lines`): a longer one comes in pieces of it, so a
#: trainer that prints without end (a progress bar's carriage returns, a dump) never fills the
#: runner's memory. A trainer's event line is a few kilobytes.
LONGEST_LINE = 1 << 20


def lines(stream: IO[str]) -> Iterator[str]:
    """`stream`'s lines as they come, read by a thread of their own. The runner's main thread,
    where its Ctrl-C handler runs, waits for each at most WAKE_SECONDS at a time: a signal that
    comes just before a blocking read starts leaves its handler pending until that thread runs
    Python again, and a silent trainer (a hung data loader) kept it waiting, the second Ctrl-C
    that should kill that trainer unheard, until a line that never came. A line longer than
    LONGEST_LINE comes in pieces, in order."""
    said: queue.SimpleQueue[str] = queue.SimpleQueue()

    def read() -> None:
        try:
            for line in iter(lambda: stream.readline(LONGEST_LINE), ""):
                said.put(line)
        finally:
            said.put("")  # the end (or a read that failed): the last item

    threading.Thread(target=read, name="mpjob-run-lines", daemon=True).start()
    while True:
        try:
            line = said.get(timeout=WAKE_SECONDS)
        except queue.Empty:
            continue  # back in Python: a pending handler runs here
        if not line:
            return
        yield line


def termination_message(path: Path) -> str | None:
    """A worker's termination file as the operator gets a pod's message: its last bytes, as the
    kubelet keeps a message's last 4096, here at most MAX_REPORT_BYTES (a report the trainer
    writes fits: a longer file is no report), from a regular file only; None when there is none."""
    raw = read_regular(path, MAX_REPORT_BYTES, last=True)
    return None if raw is None else raw.decode("utf-8", errors="replace")


_PR_SET_PDEATHSIG = 1


def die_with(parent: int) -> None:
    """Run in a worker before its exec: the kernel kills it when `mpjob run` (the thread that
    started it, the runner's main thread) dies, however it dies. The worker has its own session
    so that Ctrl-C reaches the runner only; without this a SIGKILLed runner left its workers
    training and writing checkpoints beside the rerun."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:  # the runner died before the line above
        os._exit(1)


class Workers:
    def __init__(
        self, spec: MixedPrecisionJobSpec, *, folder: Path, cwd: Path, python: str, count: int | None = None
    ) -> None:
        # Absolute: the workers run in the manifest's folder (a task.command), and a relative
        # --out would put their termination files below that folder, where nobody reads them.
        self.spec, self.folder, self.cwd, self.python = spec, folder.resolve(), cwd, python
        #: Workers of the attempt (spec.elastic may run it with fewer than spec.workers).
        self.count = count or spec.workers
        self.procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[str]] = []
        #: Whether the workers were sent a stop (the user's, a resize's, a deadline's, a stall's, a
        #: crash's cut): the attempt is ending, as on a cluster once its pods are being deleted.
        self.stopping = False

    def start(self, env: dict[str, str], container: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
        """Start every worker; returns worker 0, whose stdout carries the trainer's events. A
        task.command's `$(NAME)` is expanded with `container`, as the kubelet expands a pod's."""
        trainer = [self.python, "-m", "mpjob_trainer"]
        argv = with_interpreter(
            launcher_argv(self.spec, trainer, [self.python, "-m", "mpjob_trainer.launch"], workers=self.count),
            self.python,
        )
        cut = argv.index("--") + 1
        argv = [*argv[:cut], *(expanded(arg, container or {}) for arg in argv[cut:])]
        for worker in range(self.count):
            # Line-buffered: the event lines the runner copies here (worker 0's stdout) reach the
            # file as they come, so a killed runner leaves them for its rerun (`leftover`).
            # Created afresh: a link planted at the name is replaced, never written through.
            log = os.fdopen(created(self.folder / f"worker{worker}.log"), "w", buffering=1)
            self._logs.append(log)
            self._termination(worker).unlink(missing_ok=True)
            worker_env = {
                **env,
                "JOB_COMPLETION_INDEX": str(worker),
                TERMINATION_LOG_ENV: str(self._termination(worker)),
            }
            self.procs.append(
                subprocess.Popen(
                    argv,
                    env=worker_env,
                    cwd=self.cwd,
                    text=True,
                    stdout=subprocess.PIPE if worker == 0 else log,
                    stderr=log,
                    start_new_session=True,  # Ctrl-C reaches the runner only; it sends SIGTERM
                    preexec_fn=functools.partial(die_with, os.getpid()),
                )
            )
        threading.Thread(target=self._watch_peers, daemon=True).start()
        return self.procs[0]

    @property
    def log0(self) -> IO[str]:
        return self._logs[0]

    def signal(self, sig: int) -> None:
        self.stopping = True  # an attribute write: safe in the Ctrl-C handler (stops.CtrlC.press)
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    def stop(self, grace: float) -> None:
        """SIGTERM every worker, then SIGKILL those still running `grace` seconds later."""
        deadline = time.monotonic() + grace
        self.signal(signal.SIGTERM)
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs):
            time.sleep(0.1)
        self.signal(signal.SIGKILL)

    def kill_last(self, count: int) -> None:
        """SIGKILL the last `count` workers' process groups, as when their nodes go away (the
        peer watch then stops the rest, as a Job's pods lose their peers)."""
        for proc in self.procs[len(self.procs) - count :]:
            if proc.poll() is not None:  # reaped: its group's number may be another's by now
                continue
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def wait(self, index: int) -> AttemptOutcome:
        """Wait for every worker, then read the attempt's ending as the operator would."""
        codes = [p.wait() for p in self.procs]
        for log in self._logs:
            log.close()
        pods = []
        for worker, code in enumerate(codes):
            path = self._termination(worker)
            message = termination_message(path)
            exit_code = 128 - code if code < 0 else code  # killed by signal N: a container's 128+N
            pods.append(
                PodView(f"worker{worker}", worker, "Succeeded" if code == 0 else "Failed", False, exit_code, message)
            )
        outcome = outcome_of(JobView(index=index, pods=tuple(pods)))
        if outcome.report is None and not outcome.message:
            why = f"the trainer exited {outcome.exit_code} without a report (see {self.folder})"
            return replace(outcome, message=why)
        return outcome

    def _termination(self, worker: int) -> Path:
        return self.folder / f"termination-worker{worker}.json"

    def _watch_peers(self) -> None:
        """When one worker fails, stop the others (they would wait on it forever)."""
        while True:
            codes = [p.poll() for p in self.procs]
            if all(c is not None for c in codes):
                return
            if any(c not in (None, 0) for c in codes):
                self.stop(cutoff.CUT_GRACE_SECONDS)  # as the operator cuts the peers of a crash
                return
            time.sleep(0.2)
