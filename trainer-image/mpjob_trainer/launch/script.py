"""A `python SCRIPT ...` command whose script is not there: a configuration error before any rank.

Python says "can't open file" and exits 2 without a termination report, which the fold can only
read as an infrastructure failure: the job was retried, in vain, before the planner's repeat
rule stopped it. A missing file is as certain a user error as a missing executable (which
exec already refuses, launch.supervise), so the launcher refuses it the same way, in pods and
in `mpjob run` alike (both run the command under the launcher, in the task's working dir).

Only the unambiguous case is judged: the interpreter is python, and the first argument that
is not one of python's own options is a script path (not `-c`, `-m`, `-` or an option this
module does not know). The command is read as data, never run through a shell. Standard
library only (the launcher's start path).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence

#: python's options that take no value (`-h`/`-V` are left out: they print and exit, no script).
_FLAGS = frozenset("bBdEiIOPqRsSuvx")
#: python's options that take a value, joined (`-Wignore`) or as the next argument.
_VALUED = frozenset("WX")


def _is_python(executable: str) -> bool:
    """python, python3, python3.N (any folder), or this interpreter."""
    name = os.path.basename(executable)
    minor = name.removeprefix("python3.")
    return name in ("python", "python3") or (minor != name and minor.isdigit()) or executable == sys.executable


def _script(args: Iterator[str]) -> str | None:
    """The script python's `args` name; None when they run no file, or when unsure."""
    for arg in args:
        if arg == "--":
            return next(args, None)
        if arg == "-" or arg.startswith("--"):
            return None  # stdin, --help, --version, --check-hash-based-pycs ...
        if not arg.startswith("-"):
            return arg
        for i, letter in enumerate(arg[1:]):
            if letter in _VALUED:
                if i == len(arg) - 2:
                    next(args, None)  # the value is the next argument
                break
            if letter not in _FLAGS:
                return None  # -c code, -m module, or an option not known here
    return None


def missing_script(command: Sequence[str], cwd: str) -> str | None:
    """Why `command` cannot start in `cwd`: the script python is told to run does not exist
    there (a folder or a zip file is something python can run, so only absence counts); None
    when it does, or when `command` is not python running a script."""
    if not command or not _is_python(command[0]):
        return None
    script = _script(iter(command[1:]))
    if script is None or os.path.exists(os.path.join(cwd, script)):
        return None
    return f"task.command {list(command)!r}: its script {script!r} does not exist (working directory: {cwd})"
