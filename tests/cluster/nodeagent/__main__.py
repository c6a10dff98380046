"""`python -m tests.cluster.nodeagent --kubeconfig K --state-dir D` (what `up` starts)."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from pathlib import Path

from tests.cluster.nodeagent.agent import NodeAgent
from tests.cluster.nodeagent.log import log


def main() -> None:
    parser = argparse.ArgumentParser(description="test node agent")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--state-dir", required=True, type=Path)
    args = parser.parse_args()
    agent = NodeAgent(args.kubeconfig, args.state_dir)
    # SIGTERM (make cluster-down) stops the pods; SIGKILL leaves them for a restarted agent.
    # The handler only notes the signal: setting the Event there could deadlock on the lock a
    # wait on that Event holds in this same thread; the loop below sets it.
    signalled: list[int] = []
    signal.signal(signal.SIGTERM, lambda sig, _: signalled.append(sig))
    signal.signal(signal.SIGINT, lambda sig, _: signalled.append(sig))
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    while not signalled and not agent.stop.is_set():
        time.sleep(0.2)
    agent.stop.set()
    agent.shutdown()
    log("node agent stopped")


if __name__ == "__main__":
    main()
