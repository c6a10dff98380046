"""What may start warm, shared by the client (tests/warm/client.py), the stand-in
(tests/warm/standin.py) and the server: which commands, which server kind, and which part of
an environment a fork cannot change after the interpreter started."""

from __future__ import annotations

import os
import re
from pathlib import Path

#: A script that names one of these is served by the server that has imported the frameworks.
_FRAMEWORK = re.compile(r"\b(import|from) (transformers|lightning)\b|mpjob_trainer\.adapters")
#: Read once, at start-up, by the interpreter or the math libraries torch loads (and every
#: PYTHON* variable). TORCH* variables are not compared: in the one whole run that compared
#: them, one test process's later starts all went cold (which variable differed: not found).
_AT_START = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH")
#: Applied in the child: the search path and the stream buffering.
_IN_CHILD = ("PYTHONPATH", "PYTHONUNBUFFERED")


def cold() -> bool:
    """MPJOB_TEST_COLD=1: every process starts cold, as it would outside the tests."""
    return os.environ.get("MPJOB_TEST_COLD") == "1"


def target(argv: list[str]) -> tuple[bool, str, list[str]] | None:
    """(module?, module or script, its arguments) of `python -m MODULE ...` or
    `python SCRIPT.py ...` (argv[0] the interpreter, no options), else None."""
    if len(argv) < 2:
        return None
    if argv[1] == "-m" and len(argv) > 2:
        return True, argv[2], argv[3:]
    if argv[1].endswith(".py") and Path(argv[1]).is_file():
        return False, argv[1], argv[2:]
    return None


#: The modules a launcher starts as ranks that a stand-in hands to a server (standin.py).
RANK_MODULES = frozenset({"mpjob_trainer"})
#: ... and the console script the operator's pods name (`mpjob-launch ... -- mpjob-trainer`),
#: run as the script it is (`python /venv/bin/mpjob-trainer`, as its shebang line starts it).
RANK_SCRIPTS = frozenset({"mpjob-trainer"})


#: The operator the chart's pods start (`mpjob operator`, the console script run the same way),
#: handed to the server of the `mpjob` command ("cli"); any other `mpjob` command runs cold.
CLI_SCRIPTS = frozenset({"mpjob"})
CLI_SCRIPT_COMMANDS = frozenset({"operator"})


def rank_target(argv: list[str]) -> tuple[bool, str, list[str]] | None:
    """What a stand-in hands to a server: `python -m mpjob_trainer`, a script, the trainer's
    console script or the operator's; None for anything else (the launcher itself, `mpjob run`,
    torch's helpers)."""
    if len(argv) > 1 and os.path.isfile(argv[1]):
        script = os.path.basename(argv[1])
        if script in RANK_SCRIPTS or (script in CLI_SCRIPTS and argv[2:3] and argv[2] in CLI_SCRIPT_COMMANDS):
            return False, argv[1], argv[2:]
    found = target(argv)
    return None if found is None or (found[0] and found[1] not in RANK_MODULES) else found


#: Served by the server that has imported the `mpjob` command's own parts (no torch there):
#: the operator and the local runner's parent process.
CLI_MODULES = frozenset({"mpjob.cli"})


def kind(module: bool, name: str, args: list[str] | None = None) -> str:
    """The server that runs it: "cli" for the `mpjob` command (module or console script),
    "frameworks" for a script that imports one or runs one (a wrapper such as
    tests/unit/trainer/paced_script.py, its first argument the script), else "trainer"."""
    if module:
        return "cli" if name in CLI_MODULES else "trainer"
    if os.path.basename(name) in CLI_SCRIPTS:
        return "cli"
    scripts = [name, *(args or [])[:1]]
    named = any(_FRAMEWORK.search(Path(s).read_text()) for s in scripts if s.endswith(".py") and Path(s).is_file())
    return "frameworks" if named else "trainer"


def start_env(env: dict[str, str]) -> dict[str, str]:
    """What a request's environment must share with its server's for a fork to be the same as
    a fresh start."""
    return {k: v for k, v in env.items() if (k.startswith("PYTHON") and k not in _IN_CHILD) or k in _AT_START}


def proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name (the first is the state, the
    second the parent's pid); None: no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started_at(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat, field 22): with its pid,
    what names one process even after the pid is reused. None: no such process."""
    fields = proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def rank_record(folder: str, standin: int) -> Path:
    """Where a stand-in records the rank the server forked for it: `RANK STARTED_AT`, the second
    the stand-in's own start time (forked_rank)."""
    return Path(folder, "ranks", str(standin))


def forked_rank(folder: str, standin: int) -> int | None:
    """The rank the servers whose folder is `folder` forked for the live process `standin`, as its
    record says (None: it stands in for none, or the record is another process's of that pid)."""
    try:
        rank, started = rank_record(folder, standin).read_text().split()
    except (OSError, ValueError):
        return None
    return int(rank) if started == started_at(standin) else None
