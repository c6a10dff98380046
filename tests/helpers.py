"""Shared by tests and benchmarks: waiting on conditions with timeouts (never sleep-and-hope),
a free loopback port, `mpjob run` of a manifest as a user runs it, what Linux's /proc says
of a process (its children, whether it has ended), and where the build cache lies."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from mpjob.localrun.ports import free_port as free_port  # the tests' too: below the ephemeral range
from mpjob.localrun.rendezvous import Rendezvous
from tests import warm
from tests.warm import rules

T = TypeVar("T")


def build_cache() -> Path:
    """The build cache's root, as tests/cluster/build*.sh compute it: $MPJOB_CACHE, else mpjob
    below $XDG_CACHE_HOME or ~/.cache."""
    if os.environ.get("MPJOB_CACHE"):
        return Path(os.environ["MPJOB_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mpjob"


def paced(seconds: float) -> dict[str, float]:
    """task.args.stepDelay that makes each step of a builtin task last at least `seconds` in every
    precision: a run that must last a while lasts by the clock, not by the cores it takes."""
    return dict.fromkeys(("fp32", "bf16", "fp16"), seconds)


def wait_for(
    predicate: Callable[[], T | None], timeout: float = 60.0, interval: float = 0.2, message: str = "condition"
) -> T:
    """Poll `predicate` until it returns a truthy value (returned) or fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception as exc:  # the API may be briefly unavailable; keep the last error
            last_error = exc
            value = None
        if value:
            return value
        time.sleep(interval)
    detail = f" (last error: {last_error!r})" if last_error else ""
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}{detail}")


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def gone(pid: int) -> bool:
    """Whether the process has ended: no longer there, or a zombie waiting to be reaped."""
    fields = rules.proc_stat(pid)
    return fields is None or fields[0] == "Z"


def process_state(pid: int) -> str:
    """What /proc says a process is doing, for a message about one that would not end: its
    state, threads and where in the kernel it waits; "gone" once it is."""
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
        )
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip() or "-"
    except OSError:
        return f"pid {pid}: gone"
    return f"pid {pid}: state {status['State'].strip()}, {status['Threads'].strip()} threads, waiting in {wchan}"


@contextlib.contextmanager
def rendezvous(world: int) -> Iterator[dict[str, str]]:
    """Where the `world` ranks a test launches meet: a store this test serves until the block
    ends, on a port held from before they start, as `mpjob run` serves an attempt's
    (mpjob.localrun.rendezvous); a port only picked free could be taken before rank 0 binds it."""
    meet = Rendezvous(world)
    try:
        meet.serve()
        yield meet.env()
    finally:
        meet.close()


def launched(env: dict[str, str], nproc: int, command: list[str] | None = None) -> str:
    """The stdout of the launcher's `nproc` ranks of `command` (the builtin trainer) on one
    worker, as `env` sets them up, meeting at a store of this test's; it must end 0."""
    launcher = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", str(nproc), "--workers", "1"]
    argv = [*launcher, "--", *(command or [sys.executable, "-m", "mpjob_trainer"])]
    with rendezvous(nproc) as meet:
        proc = warm.run(argv, env={**env, **meet}, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


#: `meeting(world)`: rendezvous variables for `world` ranks, their store served until the test ends.
Meeting = Callable[[int], dict[str, str]]


def worker_logs(out: Path, tail: int = 2000) -> str:
    """The end of each worker's log of an `mpjob run` in `out`: what a run that timed out was doing."""
    logs = sorted(out.rglob("worker*.log"))
    return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-tail:]}" for log in logs)


def run_to_end(argv: list[str], out: Path, timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`mpjob run` (argv) writing to `out`, its output captured; past `timeout` it is killed and
    the test fails with its workers' logs."""
    try:
        return warm.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"mpjob run still running after {timeout:g}s:\n{worker_logs(out)}") from None


#: `mpjob run`'s flag for runs whose plot no test looks at.
NO_PLOT = ["--no-plot"]


def mpjob_run_json(
    folder: Path, manifest: dict[str, Any], timeout: float = 300, frameworks: bool = False, plot: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    """`mpjob run --json` of `manifest` written to folder/job.yaml (a command job runs there);
    asserts it ended 0 and returns its JSON events, report.json and the run directory. Its
    ranks start warm (tests/warm); `frameworks`: they import transformers or Lightning; `plot`:
    it draws training.png (0.3 s of CPU; most tests read the report only)."""
    folder.mkdir(parents=True, exist_ok=True)
    path, out = folder / "job.yaml", folder / "out"
    path.write_text(yaml.safe_dump(manifest))
    result = run_to_end(
        [sys.executable, "-m", "mpjob.cli", "run", str(path), "--out", str(out), "--json", *([] if plot else NO_PLOT)],
        out,
        timeout,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}, frameworks=frameworks),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return events, json.loads((out / "report.json").read_text()), out
