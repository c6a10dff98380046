"""`python -m tests.cluster up [--kueue]|down|status` (what `make cluster` / `make cluster-down`
run). Kueue is started with `--kueue` or MPJOB_CLUSTER_KUEUE=1 (see tests/cluster/kueue.py)."""

from __future__ import annotations

import os
import sys

from tests.cluster.controlplane import ClusterError, Layout, down, running, up


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    layout = Layout.from_env()
    try:
        if command == "up":
            with_kueue = "--kueue" in argv[1:] or os.environ.get("MPJOB_CLUSTER_KUEUE", "") not in ("", "0")
            seconds = up(layout, with_kueue=with_kueue)
            how = "already running" if seconds == 0 else f"ready in {seconds:.1f}s"
            print(f"test cluster {how}: export KUBECONFIG={layout.kubeconfig}")
        elif command == "down":
            pids = down(layout)
            print(f"test cluster stopped ({len(pids)} process(es))")
        elif command == "status":
            alive = running(layout)
            for name, pid in alive.items():
                print(f"{name}: pid {pid}")
            if not alive:
                print("test cluster: not running")
                return 1
        else:
            print(f"usage: python -m tests.cluster up [--kueue]|down|status (got {command!r})", file=sys.stderr)
            return 2
    except ClusterError as exc:
        print(f"mpjob test cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
