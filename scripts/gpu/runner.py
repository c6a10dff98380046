"""Running the GPU check's steps (scripts/gpu/steps.py says what they are): each step one
command in its own process group, within its time budget; a step out of time is stopped and
recorded as "timed out", and the next one runs. summary.json in $OUT is rewritten after every
step, with the environment (Python, torch, CUDA, the device) first."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
CUDA = torch.cuda.is_available()
#: Seconds a stopped step's processes get between SIGTERM and SIGKILL.
GRACE_S = 10


@dataclass
class Context:
    work: Path
    python: str = sys.executable

    def folder(self, name: str) -> Path:
        path = self.work / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@dataclass(frozen=True)
class Step:
    name: str
    budget_s: int
    log: str  # file under $OUT; steps may share one (appended, each under a header)
    command: Callable[[Context], list[str]]  # writes what the command reads, returns its argv
    result: Callable[[Context], tuple[dict[str, Any], str | None]]  # (figures, problem or None)
    env: dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------- running them
def run_command(argv: list[str], log: Path, budget_s: int, env: dict[str, str]) -> tuple[int | None, float]:
    """The command's exit code (None: out of time, its process group stopped) and seconds."""
    start = time.monotonic()
    with log.open("a") as sink:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            code = None
            for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
    return code, time.monotonic() - start


def step_env(step: Step) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **step.env}
    if not CUDA:
        env["OMP_NUM_THREADS"] = "1"  # a CPU rehearsal shares few cores
    return env


def run_step(step: Step, ctx: Context, out: Path, budget_scale: float) -> dict[str, Any]:
    log, budget_s = out / step.log, round(step.budget_s * budget_scale)
    argv = step.command(ctx)
    with log.open("a") as sink:
        sink.write(f"\n===== step {step.name} (budget {budget_s} s): {' '.join(argv)}\n")
    print(f"step {step.name}: start (budget {budget_s} s)", flush=True)
    code, seconds = run_command(argv, log, budget_s, step_env(step))
    record: dict[str, Any] = {"name": step.name, "budgetSeconds": budget_s, "seconds": round(seconds, 1),
                              "exitCode": code, "log": step.log}  # fmt: skip
    figures, problem = step.result(ctx)
    if code is None:
        status, problem = "timed out", f"out of its {budget_s} s budget"
    elif code != 0:
        status, problem = "failed", problem or f"exit code {code}"
    else:
        status = "failed" if problem else "passed"
    record.update(status=status, problem=problem, result=figures)
    problem = f" ({record['problem']})" if record.get("problem") else ""
    print(f"step {step.name}: {record['status']} in {seconds:.0f} s{problem}", flush=True)
    return record


def nvidia_smi() -> str | None:
    query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict[str, Any]:
    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": CUDA,
                            "cudaVersion": torch.version.cuda}  # fmt: skip
    if CUDA:
        info["device"] = torch.cuda.get_device_name(0)
        info["computeCapability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        info["nvidiaSmi"] = nvidia_smi()
    pip_check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    info["pipCheck"] = pip_check.stdout.strip().splitlines()
    return info


def main(steps: list[Step], argv: list[str] | None = None, *, description: str | None = None) -> int:
    """Run `steps` (all, or --only those), writing summary.json; 0 when each passed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True, help="summary.json and the logs")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mpjob-gpu-work"), help="what the steps write besides")
    parser.add_argument("--only", nargs="*", choices=[s.name for s in steps], help="these steps alone")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="every budget times this (a CPU rehearsal)")
    opts = parser.parse_args(argv)
    opts.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(work=opts.work)
    began = time.monotonic()
    summary: dict[str, Any] = {"started": datetime.now(UTC).isoformat(timespec="seconds"),
                               "environment": environment(), "steps": []}  # fmt: skip
    for step in steps:
        if opts.only and step.name not in opts.only:
            continue
        summary["steps"].append(run_step(step, ctx, opts.out, opts.budget_scale))
        summary["wallSeconds"] = round(time.monotonic() - began, 1)
        (opts.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {opts.out / 'summary.json'}, {summary.get('wallSeconds')} s")
    for record in summary["steps"]:
        print(
            f"  {record['name']:<11} {record['status']:<16} {record['seconds']:>6.0f} s  {record.get('problem') or ''}"
        )
    ok = all(r["status"] == "passed" for r in summary["steps"])
    return 0 if ok else 1
