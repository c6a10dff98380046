"""Start one rank: fork, then in the child its own session, death with the launcher, its
stderr into the launcher's pipe, exec. An exec that fails comes back as the OSError it was.

Why not subprocess.Popen: the launcher runs once per pod and its start-up CPU is paid on
every node; `subprocess` (with `threading`, `selectors` and friends) was a large share of
it, and the launcher needs none of Popen's other features: it reaps with waitpid(-1) itself
(as PID 1 it must reap orphans anyway) and never talks to a rank's stdin or stdout.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_PR_SET_PDEATHSIG = 1
#: What the child exits with when it cannot exec (its parent reports the real error).
_EXEC_FAILED = 127


class Spawned:
    """A started rank: its pid, and the read end of its stderr pipe (owned by the caller)."""

    __slots__ = ("pid", "stderr")

    def __init__(self, pid: int, stderr: int) -> None:
        self.pid, self.stderr = pid, stderr


def _prctl() -> Callable[..., Any] | None:
    """libc's prctl, for PR_SET_PDEATHSIG (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl: Callable[..., Any] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def spawn(argv: Sequence[str], env: Mapping[str, str]) -> Spawned:
    """Start `argv` (PATH searched in `env`) as a new session whose stderr is a pipe to us.

    Raises the OSError the exec raised (FileNotFoundError, PermissionError, ...): the child
    writes its errno into a close-on-exec pipe, which stays empty when the exec succeeds.
    """
    prctl, parent = _prctl(), os.getpid()
    env_list = {str(k): str(v) for k, v in env.items()}
    err_r, err_w = os.pipe()  # stderr of the rank
    exec_r, exec_w = os.pipe()  # both ends close-on-exec: EOF without data = exec succeeded
    pid = os.fork()
    if pid == 0:  # the child: no Python-level cleanup may run here, only exec or _exit
        try:
            os.close(err_r)
            os.close(exec_r)
            os.setsid()  # its own session and process group (see supervise)
            if prctl is not None:
                prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
                if os.getppid() != parent:  # the launcher died before the line above
                    os._exit(1)
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)  # not the launcher's handlers until exec
            signal.set_wakeup_fd(-1)
            os.dup2(err_w, 2)
            os.close(err_w)
            os.execvpe(argv[0], list(argv), env_list)
        except OSError as exc:
            os.write(exec_w, str(exc.errno or 0).encode())
        finally:
            os._exit(_EXEC_FAILED)
    os.close(err_w)
    os.close(exec_w)
    failed = b""
    while chunk := os.read(exec_r, 64):
        failed += chunk
    os.close(exec_r)
    if failed:
        os.close(err_r)
        os.waitpid(pid, 0)
        number = int(failed)
        raise OSError(number, os.strerror(number), argv[0])
    return Spawned(pid, err_r)
