"""In a child the warm-start server forked: become the process the request asked for, as
`python -m MODULE ARGS` or `python SCRIPT ARGS` would have started it, then run it as
`__main__`. Its exit (a SystemExit, an uncaught exception's traceback and status 1, or the
end of the module) is the interpreter's own up to the last atexit handler: non-daemon threads
joined, atexit handlers run, the traceback or SystemExit message printed; then it ends with
that status without releasing every module (end_now)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import io
import os
import runpy
import select
import signal
import sys
import threading
from typing import Any

_PR_SET_PDEATHSIG = 1
#: Signals the server leaves as they were at its start; a fresh interpreter has these.
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGCHLD: signal.SIG_DFL}


def streams(fds: list[int], unbuffered: bool) -> None:
    """The three standard streams on the request's descriptors, buffered as a fresh
    interpreter buffers them on pipes and files (`PYTHONUNBUFFERED` as `-u`)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    out = io.FileIO(1, "w", closefd=False)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        out if unbuffered else io.BufferedWriter(out), write_through=unbuffered
    )  # type: ignore[arg-type]
    err = io.FileIO(2, "w", closefd=False)
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        err if unbuffered else io.BufferedWriter(err),
        errors="backslashreplace",
        line_buffering=True,
        write_through=unbuffered,
    )  # type: ignore[arg-type]


def _entries(python_path: str | None) -> list[str]:
    return [p for p in (python_path or "").split(os.pathsep) if p]


def search_path(first: str, python_path: str | None) -> list[str]:
    """sys.path as a fresh interpreter builds it: the script's folder (or, for -m, the working
    directory), then PYTHONPATH's entries, then the rest as the server has it."""
    own = _entries(os.environ.get("PYTHONPATH"))  # the server's, right after its own first entry
    rest = sys.path[1:]
    if rest[: len(own)] == own:
        rest = rest[len(own) :]
    return [first, *_entries(python_path), *rest]


class Ending:
    """How the run as `__main__` ended, recorded before the interpreter's exit begins: the
    status it exits with, or an interrupt (an uncaught KeyboardInterrupt ends a fresh
    interpreter by SIGINT, after its teardown)."""

    status = 1
    interrupted = False

    @classmethod
    def record(cls, error: BaseException | None) -> None:
        cls.interrupted = isinstance(error, KeyboardInterrupt)
        cls.status = 0 if error is None else status_of(error)


def status_of(error: BaseException) -> int:
    """The exit status an uncaught exception gives a fresh interpreter."""
    if not isinstance(error, SystemExit):
        return 1
    if error.code is None:
        return 0
    return error.code if isinstance(error.code, int) else 1  # a message, printed: status 1


def end_now() -> None:
    """The last atexit handler: flush the standard streams and end with the run's status, as
    the interpreter would after releasing every module. The server's objects are most of this
    process's heap; releasing them copies each of their pages (copy-on-write), 0.45 s of CPU
    a child, which made a rank's exit outlive the launcher's settle for its failed siblings."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if Ending.interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(Ending.status & 0xFF)


def die_with_the_server() -> None:
    """The kernel kills this child when its server dies (the test process or the test cluster
    that owned it ended), as a fresh process dies with whoever supervises it."""
    server = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != server:  # it died before the line above
        os._exit(1)


def die_with_the_standin(standin: int) -> None:
    """A rank dies with its stand-in at once, as a fresh rank dies with the launcher that started it
    (PR_SET_PDEATHSIG), not when the server next reads the stand-in's closed connection (its kill
    stays the backstop). Under load that read came late enough for a rank whose launcher `mpjob
    run` had SIGKILLed (a node lost) to go on and checkpoint with its peers."""
    try:
        standin_exit = os.pidfd_open(standin)
    except ProcessLookupError:
        os._exit(1)  # gone before this child was ready

    def watch() -> None:
        select.select([standin_exit], [], [])  # readable once the stand-in has ended
        if os.getpgid(0) == os.getpid():  # its own session (stand-ins ask for one): what it started too
            os.killpg(0, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="die-with-the-standin", daemon=True).start()


def settings_from_the_environment() -> None:
    """What an imported library read from the environment at its import, read again from the
    child's: the Kubernetes client's default kubeconfig (KUBECONFIG), which the operator and
    `mpjob status` load."""
    for name in ("kubernetes.config.kube_config", "kubernetes.config"):  # the package keeps a copy
        if name in sys.modules:
            sys.modules[name].KUBE_CONFIG_DEFAULT_LOCATION = os.environ.get("KUBECONFIG", "~/.kube/config")


def become(request: dict[str, Any], fds: list[int]) -> None:
    die_with_the_server()
    atexit.register(end_now)  # registered first: the last to run
    if request.get("new_session"):
        os.setsid()
    if request.get("standin"):
        die_with_the_standin(int(request["standin"]))
    for sig, handler in _DEFAULTS.items():
        signal.signal(sig, handler)
    target, args, env = request["target"], request["args"], request["env"]
    os.chdir(request["cwd"])
    first = os.getcwd() if request["module"] else os.path.dirname(os.path.abspath(target))
    sys.path[:] = search_path(first, env.get("PYTHONPATH"))
    os.environ.clear()
    os.environ.update(env)
    settings_from_the_environment()
    streams(fds, bool(os.environ.get("PYTHONUNBUFFERED")))
    sys.argv = [target, *args]  # for a module, runpy puts its file in argv[0]
    try:
        run_as_main(target, bool(request["module"]))
    except BaseException as error:
        Ending.record(error)
        raise
    Ending.record(None)


def run_as_main(target: str, module: bool) -> None:
    if module:
        # Run as a fresh interpreter runs it: its code once more, not the copy the server
        # imported (runpy warns of a module it finds imported already).
        for name in (f"{target}.__main__", target):
            if name in sys.modules and not hasattr(sys.modules[name], "__path__"):
                del sys.modules[name]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(target, run_name="__main__")
