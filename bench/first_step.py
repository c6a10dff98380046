"""Time from starting `mpjob run` to the first training step (target <= 5 s on 2 cores).

`--processes 2`: the same with two gloo ranks (processesPerWorker), who meet at the store the
runner hosts (mpjob.localrun.rendezvous), its torch import beside theirs."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MANIFEST = """
apiVersion: mpjob.dev/v1alpha1
kind: MixedPrecisionJob
metadata: {name: first-step}
spec:
  task: {builtin: gpt, args: {nLayer: 2, nHead: 2, nEmbd: 64, blockSize: 64}}
  training: {steps: 3, batchSize: 8, logEvery: 1}
  precision: {mode: bf16}
  resources: {gpusPerWorker: 0, processesPerWorker: PROCESSES}
"""


def once(tmp: Path, processes: int) -> float:
    job = tmp / "job.yaml"
    job.write_text(MANIFEST.replace("PROCESSES", str(processes)))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(tmp / "out"), "--json", "--fresh"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = None
    for line in proc.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "step" and first is None:
            first = time.perf_counter() - start
    proc.wait()
    assert first is not None, "no step line"
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--processes", type=int, default=1, help="training processes (processesPerWorker)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        times = [once(Path(tmp), args.processes) for _ in range(args.runs)]
    print(
        f"mpjob run ({args.processes} process{'es' if args.processes > 1 else ''}) -> first training step: "
        f"median {statistics.median(times):.2f} s "
        f"(runs: {', '.join(f'{t:.2f}' for t in times)})"
    )


if __name__ == "__main__":
    main()
