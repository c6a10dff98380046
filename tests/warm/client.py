"""`Popen` and `run` as in `subprocess`, for the trainer processes the tests start: a command
`python -m MODULE ...` or `python SCRIPT ...` (this interpreter, no options) is forked by a
warm-start server that has imported torch already (tests/warm/server.py); anything else, or
every command when MPJOB_TEST_COLD=1, starts cold through `subprocess`.

A warm child has a real pid (signals, `os.killpg` with `start_new_session`), its own standard
streams, and its exit status as Popen reports it. The server starts on first use, once per
test process and kind (the framework scripts' server has imported transformers and Lightning
too), and ends with that process.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.cluster.layout import pid_alive
from tests.warm import rules
from tests.warm.replies import Replies

REPO = Path(__file__).resolve().parents[2]
#: Its sitecustomize runs the stand-in in a rank's interpreter (for_ranks).
HOOK = Path(__file__).resolve().with_name("hook")
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
#: How long a start waits for the server's answer (its child's pid).
START_ANSWER_SECONDS = 60
_SUPPORTED = {"env", "cwd", "stdin", "stdout", "stderr", "text", "start_new_session", "preexec_fn"}


#: Set by the process whose parallel workers run the tests (tests/conftest.py): the folder
#: where one server of each kind serves every worker, and the pid they end with.
SHARED, OWNER = "MPJOB_TEST_WARM_SHARED", "MPJOB_TEST_WARM_OWNER"


class _Servers:
    """One server per kind for this process, started on first use; or, under parallel workers,
    one per kind for all of them (their imports are 4-15 s of CPU a kind: started once, not
    once a worker), started by the first worker that needs it and ending with their parent."""

    def __init__(self, shared: str) -> None:
        self.lock = threading.Lock()
        self.started: dict[str, tuple[subprocess.Popen[bytes] | _Elsewhere, str, dict[str, str]]] = {}
        self.shared = shared
        self.folder = shared  # else made with the first server

    def path(self, kind: str) -> tuple[str, dict[str, str]] | None:
        """The server's socket and start-up environment; None when it could not start (the
        children then start cold, and the test process's stderr says why). A server that died
        is started again."""
        with self.lock, self.across_workers(kind):
            if kind in self.started and self.started[kind][0].poll() is not None:
                ended, stale, _ = self.started.pop(kind)
                self.tell_ended(kind, ended, "starting another")
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)  # its socket: the new one's appearing says it is ready
            if kind not in self.started:
                self.folder = self.folder or tempfile.mkdtemp(prefix="mpjob-warm-")
                self.started[kind] = self.found(kind) or self.start(kind)
            proc, path, start_env = self.started[kind]
        deadline = time.monotonic() + 120
        while not os.path.exists(path):
            if proc.poll() is not None or time.monotonic() > deadline:
                self.tell_ended(kind, proc, "its children start cold")
                return None
            time.sleep(0.05)
        return path, start_env

    @contextlib.contextmanager
    def across_workers(self, kind: str) -> Iterator[None]:
        """Held while a shared server is looked for or started: one worker at a time."""
        if not self.shared:
            yield
            return
        with open(os.path.join(self.shared, f"{kind}.lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def pid_of(self, kind: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            return int(Path(self.folder, f"{kind}.pid").read_text())
        return 0

    def found(self, kind: str) -> tuple[_Elsewhere, str, dict[str, str]] | None:
        """A shared server another worker started, serving or on its way (its socket appears
        when it is ready)."""
        pid = self.pid_of(kind)
        if not self.shared or pid <= 0 or not pid_alive(pid):
            return None
        return _Elsewhere(pid), os.path.join(self.folder, f"{kind}.sock"), rules.start_env(dict(os.environ))

    def start(self, kind: str) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
        path = os.path.join(self.folder, f"{kind}.sock")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a shared server's that died
        env = dict(os.environ)
        owner = os.environ.get(OWNER, "") if self.shared else str(os.getpid())
        with open(os.path.join(self.folder, f"{kind}.log"), "ab") as log:  # what it says if it dies
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.warm.server", path, kind, owner],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        Path(self.folder, f"{kind}.pid").write_text(str(proc.pid))
        return proc, path, rules.start_env(env)

    def tell_ended(self, kind: str, proc: subprocess.Popen[bytes] | _Elsewhere, then: str) -> None:
        """Say on stderr that the `kind` server ended (or never came up), with the end of its log."""
        said = Path(self.folder, f"{kind}.log").read_text(errors="replace")[-2000:]
        print(f"tests.warm: the {kind} server ended ({proc.poll()}); {then}. It said:\n{said}", file=sys.stderr)

    def stop(self) -> None:
        """Stop the servers this process owns: none under parallel workers (they end with
        their parent, which removes their folder: share_with_workers)."""
        if self.shared:
            return
        for proc, _, _ in self.started.values():
            assert isinstance(proc, subprocess.Popen)  # not shared: this process started each one
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        if self.folder:
            remove_folder(self.folder)


class _Elsewhere:
    """A shared server another worker started: not this process's child to wait for."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def poll(self) -> int | None:
        return None if pid_alive(self.pid) else -1


def remove_folder(folder: str) -> None:
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def share_with_workers() -> None:
    """In the process that starts parallel test workers, before it starts them: one server of
    each kind serves them all, in a folder that this process removes at its exit (its end ends
    the servers)."""
    folder = tempfile.mkdtemp(prefix="mpjob-warm-")
    os.environ[SHARED], os.environ[OWNER] = folder, str(os.getpid())
    atexit.register(remove_folder, folder)


_servers = _Servers(os.environ.get(SHARED, ""))
atexit.register(lambda: _servers.stop())


@contextlib.contextmanager
def own_servers() -> Iterator[None]:
    """For a test of the servers themselves: servers of this process's own for the block (one of
    the shared servers killed would end every worker's children with it), stopped after it."""
    global _servers
    shared, _servers = _servers, _Servers("")
    try:
        yield
    finally:
        _servers.stop()
        _servers = shared


def forked_for(standins: list[int]) -> list[int]:
    """The ranks the servers forked for these stand-ins (a process that stands in for none has
    none): a test that SIGKILLs a launcher waits for these too, not only for its children. Ask
    while the stand-ins live: a record whose start time is not the live process's is stale."""
    if not _servers.folder:
        return []
    return [rank for pid in standins if (rank := rules.forked_rank(_servers.folder, pid)) is not None]


def for_ranks(env: dict[str, str] | None = None, *, frameworks: bool = False, cli: bool = False) -> dict[str, str]:
    """`env` (default: this process's) for a launcher (`mpjob run`, `mpjob_trainer.launch`)
    whose ranks should start warm: each rank's interpreter stands in for it and has this
    process's server fork it (tests/warm/standin.py). `frameworks`: the ranks run scripts that
    import transformers or Lightning (that server costs a few seconds to start); `cli`: the
    `mpjob` command's server too (`mpjob operator` as a pod starts it)."""
    env = dict(os.environ if env is None else env)
    if rules.cold():
        return env
    kinds = ("trainer", *(("frameworks",) if frameworks else ()), *(("cli",) if cli else ()))
    for kind in kinds:
        if _servers.path(kind) is None:
            return env
    return with_stand_ins(env, Path(_servers.folder))


def with_stand_ins(env: dict[str, str], servers: Path) -> dict[str, str]:
    """`env` with the stand-in on its search path and `servers` as the folder of the servers'
    sockets (`KIND.sock`); unchanged with MPJOB_TEST_COLD=1."""
    if rules.cold():
        return env
    search = [str(HOOK), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "MPJOB_WARM_DIR": str(servers), "PYTHONPATH": os.pathsep.join(search)}


def _fd(spec: Any, default: int, opened: list[int], keep: list[int]) -> int:
    """The descriptor a child's stream gets: inherited, /dev/null, a file's, or a pipe's write end."""
    if spec is None:
        return default
    if spec == DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        opened.append(fd)
        return fd
    if spec == PIPE:
        read, write = os.pipe()
        keep.append(read)
        opened.append(write)
        return write
    return spec if isinstance(spec, int) else spec.fileno()


class Popen:
    """A started process, warm when it can be (see the module's text), with Popen's surface."""

    def __init__(self, args: list[Any], **kw: Any) -> None:
        unknown = set(kw) - _SUPPORTED
        if unknown:
            raise TypeError(f"tests.warm.Popen does not take {sorted(unknown)}")
        self.args = [str(a) for a in args]
        self.returncode: int | None = None
        self.stdin: IO[Any] | None = None
        self.stdout: IO[Any] | None = None
        self.stderr: IO[Any] | None = None
        self._cold: subprocess.Popen[Any] | None = None
        self._conn: socket.socket | None = None
        #: communicate's readers of stdout and stderr, started by its first call, and what they read
        self._readers: list[threading.Thread] | None = None
        self._read: dict[str, Any] = {}
        env = dict(os.environ if kw.get("env") is None else kw["env"])
        kw["env"] = env
        served = self._server(env, kw)
        if served is None:
            if rules.rank_target(self.args) is not None:  # cold as asked: no stand-in either
                env.pop("MPJOB_WARM_DIR", None)
            self._cold = subprocess.Popen(self.args, **kw)
            self.pid, self.stdin, self.stdout, self.stderr = (
                self._cold.pid,
                self._cold.stdin,
                self._cold.stdout,
                self._cold.stderr,
            )
        else:
            self._start(served, env, kw)

    def _server(self, env: dict[str, str], kw: dict[str, Any]) -> tuple[str, bool, str, list[str]] | None:
        target = rules.target(self.args) if self.args[0] == sys.executable else None
        if target is None or rules.cold() or kw.get("stdin") == PIPE or kw.get("preexec_fn") is not None:
            return None
        module, name, rest = target
        server = _servers.path(rules.kind(module, name, rest))
        if server is None or rules.start_env(env) != server[1]:
            return None
        return server[0], module, name, rest

    def _start(self, served: tuple[str, bool, str, list[str]], env: dict[str, str], kw: dict[str, Any]) -> None:
        path, module, name, rest = served
        opened: list[int] = []
        reads: list[int] = []
        fds = [_fd(kw.get("stdin"), 0, opened, [])]
        fds.append(_fd(kw.get("stdout"), 1, opened, reads))
        stdout_read = reads[-1] if kw.get("stdout") == PIPE else None
        fds.append(fds[1] if kw.get("stderr") == STDOUT else _fd(kw.get("stderr"), 2, opened, reads))
        stderr_read = reads[-1] if kw.get("stderr") == PIPE else None
        request = {
            "module": module,
            "target": name,
            "args": rest,
            "env": env,
            "cwd": str(kw.get("cwd") or os.getcwd()),
            "new_session": bool(kw.get("start_new_session")),
        }
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(path)
            socket.send_fds(self._conn, [json.dumps(request).encode() + b"\n"], fds)
        finally:
            for fd in opened:
                os.close(fd)
        self._replies = Replies(self._conn)
        reply = self._replies.next(START_ANSWER_SECONDS)
        if reply is None:  # the server forks at once: one that does not answer is stuck, not busy
            raise RuntimeError(f"the warm-start server at {path} did not answer in {START_ANSWER_SECONDS} s")
        self.pid = int(reply["pid"])
        mode = "r" if kw.get("text") else "rb"
        self.stdout = open(stdout_read, mode) if stdout_read is not None else None  # noqa: SIM115
        self.stderr = open(stderr_read, mode) if stderr_read is not None else None  # noqa: SIM115

    @property
    def forked(self) -> bool:
        """True when a server forked it, False when it started cold."""
        return self._cold is None

    def poll(self) -> int | None:
        if self._cold is not None:
            self.returncode = self._cold.poll()
        elif self.returncode is None:
            self._ended(0)
        return self.returncode

    def _ended(self, timeout: float | None) -> bool:
        reply = self._replies.next(timeout)
        if reply is None:
            return False
        self.returncode = int(reply["returncode"])
        assert self._conn is not None
        self._conn.close()
        return True

    def wait(self, timeout: float | None = None) -> int:
        if self._cold is not None:
            self.returncode = self._cold.wait(timeout)
            return self.returncode
        if self.returncode is None and not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        if self._cold is not None:
            out, err = self._cold.communicate(timeout=timeout)
            self.returncode = self._cold.returncode
            return out, err
        if self._readers is None:  # a second call (after a timeout) joins the same readers
            self._readers = [
                threading.Thread(target=lambda n=n, f=f: self._read.__setitem__(n, f.read()), daemon=True)
                for n, f in (("out", self.stdout), ("err", self.stderr))
                if f is not None
            ]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self._close_streams()
        return self._read.get("out"), self._read.get("err")

    def _close_streams(self) -> None:
        if self._readers is not None and any(reader.is_alive() for reader in self._readers):
            return  # a reader blocked in read() holds its stream's lock: close() would wait on it forever
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Popen:
        return self

    def __exit__(self, *exc: object) -> None:
        self._close_streams()
        self.wait()


def run(
    args: list[Any], *, capture_output: bool = False, timeout: float | None = None, check: bool = False, **kw: Any
) -> subprocess.CompletedProcess[Any]:
    """subprocess.run over Popen above: a child still running at `timeout` is killed."""
    if capture_output:
        kw["stdout"] = kw["stderr"] = PIPE
    with Popen(args, **kw) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            # Bounded: a process it started that outlived it (a hung rank) may still hold its
            # pipes, and the test must fail with the timeout rather than wait on them forever.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=30)
            raise
    done = subprocess.CompletedProcess(proc.args, proc.wait(), out, err)
    if check:
        done.check_returncode()
    return done
