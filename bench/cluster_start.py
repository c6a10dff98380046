"""Warm start of the test control plane: `make cluster` (binaries cached) to API ready."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

from tests.cluster.controlplane import Layout, down, up


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        layout = Layout(Path(tmp) / "cluster", int(os.environ.get("BENCH_PORT_BASE", "18380")))
        up(layout)  # first start: certificates, etcd data
        down(layout)
        times = []
        for _ in range(3):
            start = time.perf_counter()
            up(layout)
            times.append(time.perf_counter() - start)
            down(layout)
    print(
        f"warm `make cluster` to ready (API + 2 nodes Ready + default ServiceAccount): median "
        f"{statistics.median(times):.1f} s (runs: {', '.join(f'{t:.1f}' for t in times)})"
    )


if __name__ == "__main__":
    main()
