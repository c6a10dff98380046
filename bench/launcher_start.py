"""The launcher's start-up cost: CPU seconds `mpjob-launch` spends per pod before its rank runs.

Every trainer pod runs the launcher, so its start-up is paid once per pod and per attempt (at
N=500 pods, on the nodes the operator's Jobs land on). Three figures, each the median of
--runs launches of one local rank:

- up to spawn: CPU (user + system) of the launcher process from exec to the moment its rank
  starts. The rank reads the launcher's /proc/<ppid>/schedstat (nanoseconds on a CPU) first
  thing; while the rank's interpreter starts the launcher sleeps in select(), so this is the
  launcher's own start-up (interpreter, imports, flags, the fork of the rank);
- total, trivial rank: the launcher's CPU for the whole pod when its rank is trivial (a
  Python that writes a Succeeded report, as the SDK does, and exits 0): wait4's rusage of the
  launcher and its rank, minus the same rank run alone;
- total, rank without a report: the same for a rank that exits 0 and writes nothing: the
  launcher must build the report (pydantic is imported then).

Target: <= 50 ms of CPU per pod up to spawn. Usage:
    uv run --no-sync python bench/launcher_start.py [--runs 15] [--json]
Compare another checkout's launcher with PYTHONPATH=<checkout>/trainer-image:<checkout>/contract.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LAUNCHER = [str(Path(sys.executable).with_name("mpjob-launch")), "--nproc-per-worker", "1", "--"]
#: The rank: the launcher's CPU so far (schedstat, ns) into a file, then a report, exit 0.
RANK = """
import os, sys
with open(f"/proc/{os.getppid()}/schedstat") as f:
    ns = int(f.read().split()[0])
open(sys.argv[1], "w").write(str(ns))
if sys.argv[2] == "report":
    path = os.environ["MPJOB_TERMINATION_LOG"]
    open(path, "w").write('{"reason":"Succeeded","step":1,"message":"trained 1 steps in fp32"}')
"""


def _cpu_of(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of a process and the children it waited for (wait4)."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime


def measure(runs: int, report: str) -> dict[str, float]:
    """Medians over `runs` launches: up to spawn, total with the rank, the rank alone (seconds)."""
    spawn, total, alone = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        mark = Path(tmp) / "schedstat"
        env = {**os.environ, "MPJOB_TERMINATION_LOG": str(Path(tmp) / "pod.json")}
        rank = [sys.executable, "-S", "-c", RANK, str(mark), report]
        for _ in range(runs):
            total.append(_cpu_of([*LAUNCHER, *rank], env))
            spawn.append(int(mark.read_text()) / 1e9)
            alone.append(_cpu_of(rank, {**env, "MPJOB_TERMINATION_LOG": str(Path(tmp) / "alone.json")}))
    median_alone = statistics.median(alone)
    return {
        "upToSpawn": statistics.median(spawn),
        "total": statistics.median(total) - median_alone,
        "rankAlone": median_alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    _cpu_of([*LAUNCHER, sys.executable, "-c", "pass"], dict(os.environ))  # warm the bytecode caches
    figures = {"withReport": measure(args.runs, "report"), "withoutReport": measure(args.runs, "none")}
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    print(f"mpjob-launch start-up, median of {args.runs} launches of one local rank (CPU ms of the launcher)")
    for name, fig in figures.items():
        print(
            f"  rank {'writes a report' if name == 'withReport' else 'writes no report'}: "
            f"up to spawn {fig['upToSpawn'] * 1000:.1f}, whole pod {fig['total'] * 1000:.1f} "
            f"(the rank alone: {fig['rankAlone'] * 1000:.1f})"
        )
    verdict = "meets" if figures["withReport"]["upToSpawn"] <= 0.050 else "misses"
    print(f"target <= 50 ms up to spawn: {verdict}")


if __name__ == "__main__":
    main()
