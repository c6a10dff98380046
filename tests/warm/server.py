"""The warm-start server: one Python process that has imported torch and the trainer once, and
forks a child for each process a test starts (`python -m mpjob_trainer`, `python script.py`).

A fresh trainer process spends most of its CPU importing torch (about 2.3 s of the 3 s a short
test run takes on this machine; transformers' Trainer or Lightning add 3-4 s more). The tests
start well over a thousand of them, two or three side by side on two cores, so the imports
were most of the suite's time. A child forked here has them already and runs the same code: the
module or script as `__main__`, with the request's argv, environment, working directory and
standard streams, in a session of its own when asked. The client (tests/warm/client.py) gets
its real pid (signals and process groups work as for any child) and its exit status.

Protocol, one connection per child: the client sends one JSON line and its three standard
streams as file descriptors (SCM_RIGHTS); the server answers `{"pid": N}`, then, when the child
ends, `{"returncode": R}` (negative: killed by that signal, as Popen has it). A request from a
stand-in (tests/warm/standin.py: a cold interpreter that a launcher started as its rank) is
`tied`: it carries its interpreter's prefix, the server answers `{"cold": why}` when the
interpreter or the start-up environment differs from its own, and its child is killed with
its process group when the stand-in's connection closes (the stand-in was SIGKILLed).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from tests.warm import rules

#: What every server imports before it serves: what `python -m mpjob_trainer` imports first, and
#: torch._dynamo, which the first optimizer a process builds imports (torch's optimizers are
#: wrapped to keep dynamo out, and the wrapper imports it on first call): 1.6 s more a process.
BASE = ("torch", "torch._dynamo", "mpjob_trainer.__main__", "mpjob_trainer.session", "mpjob_contract.report")
#: The framework adapters' imports, for the server of the framework scripts.
FRAMEWORKS = ("transformers", "lightning.pytorch", "mpjob_trainer.adapters.hf", "mpjob_trainer.adapters.lightning")
#: What the `mpjob` command imports for its subcommands: the operator (kopf, the Kubernetes
#: client: 1.3 s of CPU before its first line) and `mpjob run` (0.7 s, and 1.2 s more for
#: matplotlib, which draws every run's plot at its end).
CLI = (
    "mpjob.cli",
    "mpjob.controller.main",
    "mpjob.controller.handlers",
    "mpjob.jobstatus",
    "mpjob.localrun.cli",
    "mpjob.localrun.elastic",
    "mpjob.localrun.progress",
    "mpjob.localrun.runner",
    "mpjob.localrun.plot",
)
PRELOADS = {"trainer": BASE, "frameworks": BASE + FRAMEWORKS, "cli": CLI}
#: Packages that import their classes on first use (a module-level __getattr__), resolved in
#: full by the server of that kind: the Kubernetes client's API and model classes, which the
#: operator's first calls imported at 0.8 s of CPU a start, 60-odd operators a run.
LAZY = {"cli": ("kubernetes.client",)}


def native_threads() -> int:
    """Threads of this process as the kernel sees them (fork copies only the calling one)."""
    return len(os.listdir("/proc/self/task"))


def preload(kind: str) -> None:
    for name in PRELOADS[kind]:
        importlib.import_module(name)
    for name in LAZY.get(kind, ()):
        package = importlib.import_module(name)
        for export in dir(package):
            getattr(package, export)
    # Out of the collector's sight: a child's collections and its exit's final one then leave
    # these objects' pages alone instead of copying every one of them (copy-on-write), which
    # made a child's exit slower than a fresh process's whole teardown.
    gc.freeze()
    if native_threads() != 1:  # a fork would leave a lock held by a thread that is not there
        raise SystemExit(f"warm server: {native_threads()} threads after the imports; cannot fork safely")


def receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("request cut short")
        data += more
    return json.loads(data), fds


class Server:
    """Accepts requests, forks one child for each and reports its ending on its connection."""

    def __init__(self, path: str, parent: int | None) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        #: the test process, if any: the server ends with it (the test cluster's end when stopped)
        self.parent = None if parent is None else os.pidfd_open(parent)
        if self.parent is not None:
            self.selector.register(self.parent, selectors.EVENT_READ)
        #: pidfd -> (pid, the connection waiting for its ending)
        self.children: dict[int, tuple[int, socket.socket]] = {}
        #: Where each child's CPU is written when it ends (MPJOB_TEST_CPU_LOG), and what each
        #: child was asked to run, by pid, for that line; both empty when no log is asked for.
        self.cpu_log = os.environ.get("MPJOB_TEST_CPU_LOG")
        self.requests: dict[int, dict[str, str]] = {}
        #: a tied request's connection -> its child's pid, while both are there
        self.tied: dict[socket.socket, int] = {}
        self.start_env = rules.start_env(dict(os.environ))

    def serve(self) -> tuple[dict[str, Any], list[int]]:
        """Serve until the listener is closed; returns only in a forked child, with its request."""
        while True:
            for key, _ in self.selector.select():
                if key.fileobj == self.parent:
                    os._exit(0)
                if key.fileobj is self.listener:
                    child = self.accept()
                    if child is not None:
                        return child
                elif isinstance(key.fileobj, socket.socket):
                    self.untie(key.fileobj, kill=True)
                else:
                    self.reap(int(key.fd))

    def accept(self) -> tuple[dict[str, Any], list[int]] | None:
        conn, _ = self.listener.accept()
        try:
            request, fds = receive(conn)
        except (OSError, ValueError):
            conn.close()
            return None
        refused = self.refusal(request) if request.get("tied") else None
        if refused is not None:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"cold": refused}).encode() + b"\n")
            conn.close()
            return None
        pid = os.fork()
        if pid == 0:
            self.close_all(conn)
            return request, fds
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = (pid, conn)
        if self.cpu_log:
            self.requests[pid] = described(request)
        self.selector.register(pidfd, selectors.EVENT_READ)
        if request.get("tied"):
            self.tied[conn] = pid
            self.selector.register(conn, selectors.EVENT_READ)
        # A client gone already (a stand-in SIGKILLed as it started) is no reason to stop serving:
        # a tied child is killed when its connection's end is read, another runs and is reaped.
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        return None

    def refusal(self, request: dict[str, Any]) -> str | None:
        """Why a stand-in's request must start cold: another interpreter, or a start-up setting
        a fork cannot change (rules.start_env); None when it can be forked here."""
        if request.get("prefix") != sys.prefix:
            return f"interpreter {request.get('prefix')}, not {sys.prefix}"
        differs = {k for k, _ in set(rules.start_env(request["env"]).items()) ^ set(self.start_env.items())}
        return f"start-up environment differs: {sorted(differs)}" if differs else None

    def untie(self, conn: socket.socket, kill: bool) -> None:
        """A tied child's stand-in is gone (kill) or the child ended: stop watching the connection."""
        pid = self.tied.pop(conn, None)
        if pid is None:
            return
        self.selector.unregister(conn)
        if kill:  # the stand-in's own SIGKILL, passed on to what it stood in for
            for send in (os.kill, os.killpg):  # the child itself, even before its setsid
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    send(pid, signal.SIGKILL)

    def reap(self, pidfd: int) -> None:
        pid, conn = self.children.pop(pidfd)
        self.untie(conn, kill=False)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status, usage = os.wait4(pid, 0)
        if self.cpu_log:
            account(self.cpu_log, self.requests.pop(pid), usage)
        with contextlib.suppress(OSError):  # the client went away first
            conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        conn.close()

    def close_all(self, conn: socket.socket) -> None:
        """In a child: none of the server's descriptors stay open."""
        for pidfd, (_, other) in self.children.items():
            os.close(pidfd)
            other.close()
        self.selector.close()
        self.listener.close()
        if self.parent is not None:
            os.close(self.parent)
        conn.close()


def described(request: dict[str, Any]) -> dict[str, str]:
    """What a child was asked to run, for its line in the CPU log."""
    env = request["env"]
    return {
        "command": " ".join([request["target"], *request["args"]])[:200],
        "test": env.get("PYTEST_CURRENT_TEST", ""),  # set by pytest in a test's own children
        "host": env.get("HOSTNAME", ""),  # a pod's name, in the test node agent's children
    }


def account(path: str, described: dict[str, str], usage: Any) -> None:
    """A JSON line in the CPU log (`path`) for a child that ended: what it ran and the CPU
    seconds it and the children it waited for used (where a suite's CPU goes, by process)."""
    line = {**described, "cpu": round(usage.ru_utime + usage.ru_stime, 3), "server": os.getpid()}
    with open(path, "a") as log:
        log.write(json.dumps(line) + "\n")


def main() -> None:
    path, kind, parent = sys.argv[1], sys.argv[2], int(sys.argv[3])
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    preload(kind)
    with contextlib.suppress(FileNotFoundError):  # a socket a stopped server left
        os.unlink(path + ".tmp")
    server = Server(path + ".tmp", parent or None)
    os.rename(path + ".tmp", path)  # the client waits for the path: it appears ready to connect
    request, fds = server.serve()
    from tests.warm.child import become

    become(request, fds)


if __name__ == "__main__":
    main()
