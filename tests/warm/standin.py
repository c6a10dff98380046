"""A stand-in: a cold interpreter that a launcher started as one of its ranks (`python -m
mpjob_trainer ...` or `python SCRIPT.py ...`, run by `mpjob run` or `mpjob_trainer.launch`)
has a warm-start server fork the rank instead, and stands in for it until it ends.

The launcher supervises its ranks as its own children: it reaps them with waitpid, signals
their process groups and has them die with it (PR_SET_PDEATHSIG). A process forked by the
server can be none of that, so the launcher keeps a real child: this interpreter, which passes
its argv, environment, working directory and standard streams to the server, forwards every
signal it can catch to the forked rank, and ends as the rank ended (its exit status, or death
by the same signal). A SIGKILL cannot be forwarded: the server kills the rank when the stand-in's
connection closes. The stand-in runs from sitecustomize (tests/warm/hook), before `__main__`,
in every interpreter whose environment names a server folder (`MPJOB_WARM_DIR`, set by
client.for_ranks); any other command, or a request the server refuses, runs cold as it came.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import sys
from typing import Any

from tests.warm import rules
from tests.warm.replies import Replies

#: Signals the stand-in passes on (the rest keep their default action: the stand-in's own).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def request(argv: list[str]) -> tuple[str, dict[str, Any]] | None:
    """The server's socket and the request for a rank command, or None (run cold)."""
    found = rules.rank_target(argv)
    if found is None:
        return None
    module, name, args = found
    path = os.path.join(os.environ["MPJOB_WARM_DIR"], f"{rules.kind(module, name, args)}.sock")
    if not os.path.exists(path):
        went_cold({"target": name, "args": args}, f"no server at {path}")
        return None
    return path, {
        "module": module,
        "target": name,
        "args": args,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "new_session": True,
        "tied": True,
        "standin": os.getpid(),
        "prefix": sys.prefix,
    }


def went_cold(message: dict[str, Any], why: str) -> None:
    """Say why a rank runs cold where the suite looks for it: a line in the servers' folder
    (cold.log), not on the rank's own streams."""
    line = json.dumps({"pid": os.getpid(), "argv": [message["target"], *message["args"]], "why": why}) + "\n"
    try:
        with open(os.path.join(os.environ["MPJOB_WARM_DIR"], "cold.log"), "a") as log:
            log.write(line)
    except OSError:
        pass


def end_as(returncode: int) -> None:
    """Exit as the rank ended: its status, or its death by the same signal (no core file)."""
    if returncode >= 0:
        os._exit(returncode)
    sig = -returncode
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action is to ignore it


def record(rank: int) -> None:
    """Name the forked rank where a test that SIGKILLs its launcher can wait for it too: it is the
    server's child, not this stand-in's, and dies a moment after it (child.die_with_the_standin)."""
    path = rules.rank_record(os.environ["MPJOB_WARM_DIR"], os.getpid())
    try:
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"{rank} {rules.started_at(os.getpid())}")
    except OSError:
        pass


def stand_in(path: str, message: dict[str, Any]) -> None:
    """Have the server fork the rank, pass signals on, end as it ends; returns only when the
    server refused the request (the caller then runs cold)."""
    pending: list[int] = []
    rank: list[int] = []

    def forward(sig: int, _frame: object) -> None:
        if rank:
            os.kill(rank[0], sig)
        else:
            pending.append(sig)

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as exc:
        went_cold(message, f"the server does not answer (ended with its test process?): {exc}")
        return
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    socket.send_fds(conn, [json.dumps(message).encode() + b"\n"], [0, 1, 2])
    replies = Replies(conn)
    try:
        first = replies.next()
    except ConnectionError:  # stopped before it answered
        first = None
    if first is None or "cold" in first:
        went_cold(message, (first or {}).get("cold", "the server stopped before it answered"))
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        conn.close()
        for sig in pending:
            os.kill(os.getpid(), sig)
        return
    rank.append(int(first["pid"]))
    record(rank[0])
    for sig in pending:
        os.kill(rank[0], sig)
    try:
        ended = replies.next()
    except ConnectionError:  # the server died, and its children with it (child.die_with_the_server)
        ended = None
    end_as(-signal.SIGKILL if ended is None else int(ended["returncode"]))


def main() -> None:
    """From sitecustomize: stand in for a rank command this interpreter was started with."""
    found = request(list(sys.orig_argv))
    if found is not None:
        stand_in(*found)
