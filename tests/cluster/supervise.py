"""`python -m tests.cluster.supervise PIDFILE -- ARGV...`: run one control-plane process and
start it again whenever it dies (a crash, or `kill -9` in a chaos run), as a kubelet restarts
a static pod. A real control plane survives its apiserver or etcd restarting; this makes the
test cluster behave the same so the operator's behaviour through such a restart can be tested.

The child's PID is written to PIDFILE (the chaos benchmark kills that process); the
supervisor's own PID is the component's (`down` stops its process group, child included).
A child that dies within START_GRACE seconds of starting, CRASH_LOOP times in a row, is not
restarted again: the supervisor exits with its code, so `up` reports a broken flag or a
taken port at once instead of waiting on a crash loop.
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


def supervise(pidfile: Path, argv: list[str]) -> int:
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    quick_deaths = 0
    while True:
        started = time.monotonic()
        child = subprocess.Popen(argv)
        pidfile.write_text(str(child.pid))
        code = child.wait()
        if stopping:
            return 0
        quick_deaths = quick_deaths + 1 if time.monotonic() - started < START_GRACE else 0
        print(f"supervise: {argv[0]} exited {code}; restarting", file=sys.stderr, flush=True)
        if quick_deaths >= CRASH_LOOP:
            print(f"supervise: {argv[0]} keeps dying at start; giving up", file=sys.stderr, flush=True)
            return code if code > 0 else 1
        time.sleep(RESTART_DELAY)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m tests.cluster.supervise PIDFILE -- ARGV...", file=sys.stderr)
        return 2
    return supervise(Path(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
