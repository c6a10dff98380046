"""`python -m tests.cluster.nodeagent --kubeconfig K --state-dir D` (what `up` starts)."""

from __future__ import annotations

import argparse
import signal
import threading
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
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    while not agent.stop.wait(1):
        pass
    agent.shutdown()
    log("node agent stopped")


if __name__ == "__main__":
    main()
