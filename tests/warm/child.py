"""In a child the warm-start server forked: become the process the request asked for, as
`python -m MODULE ARGS` or `python SCRIPT ARGS` would have started it, then run it as
`__main__`. Its exit (a SystemExit, an uncaught exception's traceback and status 1, or the
end of the module) is the interpreter's own, atexit handlers included."""

from __future__ import annotations

import io
import os
import runpy
import signal
import sys
from typing import Any

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


def become(request: dict[str, Any], fds: list[int]) -> None:
    if request.get("new_session"):
        os.setsid()
    for sig, handler in _DEFAULTS.items():
        signal.signal(sig, handler)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    streams(fds, bool(os.environ.get("PYTHONUNBUFFERED")))
    target, args = request["target"], request["args"]
    if request["module"]:
        sys.argv = [target, *args]  # runpy puts the module's file in argv[0]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
