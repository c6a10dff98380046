"""`python -m tests.cluster.supervise PIDFILE -- ARGV...`: run one control-plane process and
start it again whenever it dies (a crash, or `kill -9` in a chaos run), as a kubelet restarts
a static pod. A real control plane survives its apiserver or etcd restarting; this makes the
test cluster behave the same so the operator's behaviour through such a restart can be tested.

The child's PID is written to PIDFILE (the chaos benchmark kills that process); the
supervisor's own PID is the component's (`down` stops its process group, child included).
A child that never came up (it died within START_GRACE seconds of starting, CRASH_LOOP times
in a row) is not restarted again: the supervisor exits with its code, so `up` reports a
broken flag or a taken port at once instead of waiting on a crash loop. Quick deaths later
(waiting on a restarting dependency) are retried with a backoff up to MAX_RESTART_DELAY.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

START_GRACE = 3.0
CRASH_LOOP = 3
RESTART_DELAY = 0.2
MAX_RESTART_DELAY = 5.0


class Supervisor:
    """One child at a time; `stop` (SIGTERM/SIGINT) passes the signal on and ends the loop."""

    def __init__(self, pidfile: Path, argv: list[str]) -> None:
        self.pidfile, self.argv = pidfile, argv
        self.stopping = False
        self.child: subprocess.Popen[bytes] | None = None

    def stop(self, signum: int, _frame: FrameType | None) -> None:
        self.stopping = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def loop(self) -> int:
        quick_deaths, ever_up = 0, False
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv)
            self.pidfile.write_text(str(self.child.pid))
            code = self.child.wait()
            if self.stopping:
                return 0
            lived = time.monotonic() - started >= START_GRACE
            ever_up = ever_up or lived
            quick_deaths = 0 if lived else quick_deaths + 1
            print(f"supervise: {self.argv[0]} exited {code}; restarting", file=sys.stderr, flush=True)
            # Only a process that never came up is given up on: one that ran may die again
            # while a dependency restarts (Kueue while the apiserver does), and keeps trying.
            if quick_deaths >= CRASH_LOOP and not ever_up:
                print(f"supervise: {self.argv[0]} keeps dying at start; giving up", file=sys.stderr, flush=True)
                return code if code > 0 else 1
            time.sleep(min(MAX_RESTART_DELAY, RESTART_DELAY * 2**quick_deaths))


def supervise(pidfile: Path, argv: list[str]) -> int:
    """Run `argv` until told to stop, restarting it when it dies; the exit code on giving up."""
    supervisor = Supervisor(pidfile, argv)
    previous = {sig: signal.signal(sig, supervisor.stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return supervisor.loop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m tests.cluster.supervise PIDFILE -- ARGV...", file=sys.stderr)
        return 2
    return supervise(Path(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
