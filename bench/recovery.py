"""Recovery in place vs a restart, through `mpjob run` (the quickstart's fp16 -> bf16 story on
the smaller GPT the tests use): attempts[].recoverySeconds of the bf16 attempt each way, side by
side, and the restart path broken down from the trainers' own event lines (target: in place
<= 1 s on 2 CPU cores). Then the same for an out-of-memory at step 60 (the mlp's injected one):
the attempt in the smaller micro-batch, in place and restarted; and the quickstart's story on a
model sharded over 2 processes (FSDP2), whose model is wrapped anew in bf16 in the same processes;
and an `auto` job (the default mode) falling back from the bf16 it measured.

    PYTHONPATH=. uv run --no-sync python bench/recovery.py [--runs 3] [--cluster] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

JOB = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "recovery"},
    "spec": {
        "task": {
            "builtin": "gpt",
            "args": {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 64, "overflowAtStep": 60},
        },
        "training": {"steps": 80, "batchSize": 8, "logEvery": 10, "seed": 0},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": 50},
        "resources": {"gpusPerWorker": 0},
    },
}


#: An out-of-memory from step 60 on at micro-batches over 4 samples: the next attempt splits 8 into 4 x 2.
OOM_JOB = json.loads(json.dumps(JOB))
OOM_JOB["spec"]["task"] = {
    "builtin": "mlp",
    "args": {"inputs": 8, "hidden": 16, "samples": 256, "outOfMemoryAbove": 4, "outOfMemoryFromStep": 60},
}


#: The quickstart's story sharded over 2 processes (FSDP2, gathered in the attempt's precision).
FSDP_JOB = json.loads(json.dumps(JOB))
FSDP_JOB["spec"]["parallelism"] = {"strategy": "fsdp"}
FSDP_JOB["spec"]["resources"] = {"gpusPerWorker": 0, "processesPerWorker": 2}


#: `auto` (the default mode) with fp32 made slow: bf16 is measured, its quality gate finds it
#: drifting at step 20, and fp32 goes on from the checkpoint at step 10 (in place: the launch's
#: plan for the precision measured).
AUTO_JOB = json.loads(json.dumps(JOB))
AUTO_JOB["spec"]["task"] = {
    "builtin": "mlp",
    "args": {"inputs": 8, "hidden": 16, "samples": 256, "cancellationOffset": 1000, "stepDelay": {"fp32": 0.25}},
}
AUTO_JOB["spec"]["training"].update(steps=30, batchSize=16)
AUTO_JOB["spec"]["precision"] = {"mode": "auto"}
AUTO_JOB["spec"]["checkpoint"] = {"everySteps": 10}
AUTO_JOB["spec"]["validation"] = {"everySteps": 10, "maxLossDelta": 0.05}


def run(tmp: Path, *, in_place: bool, base: dict = JOB) -> dict[str, float]:
    """One run: the second attempt's recoverySeconds and, for a restart after a numeric fault,
    where that time went."""
    job = json.loads(json.dumps(base))
    job["spec"]["precision"]["inPlace"] = in_place
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    out = tmp / "out"
    cmd = [sys.executable, "-m", "mpjob.cli", "run", str(tmp / "job.yaml"), "--out", str(out), "--plain", "--fresh"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    report = json.loads((out / "report.json").read_text())
    figures = {"recoverySeconds": float(report["attempts"][1]["recoverySeconds"])}
    if not in_place and base is JOB:
        figures.update(breakdown(out))
    return figures


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def breakdown(out: Path) -> dict[str, float]:
    """The restart path from the trainers' clocks: the fault line; the next process's first line
    (its model built and set up for the precision: keepFp32); its resume line (checkpoint loaded,
    the first step next)."""
    fault = next(e for e in events(out / "attempts/a0/worker0.log") if e["event"] == "fault")["time"]
    second = events(out / "attempts/a1/worker0.log")
    first = second[0]["time"]
    resumed = next(e["time"] for e in second if e["event"] == "resume")
    return {
        "fault -> next process's first line (exit, plan, spawn, imports, model build)": first - fault,
        "first line -> checkpoint loaded": resumed - first,
    }


PATHS = (("in place", True), ("restart", False))
CASES = {
    "mpjob run": JOB,
    "mpjob run, out of memory": OOM_JOB,
    "mpjob run, fsdp 2 processes": FSDP_JOB,
    "mpjob run, auto (bf16 measured)": AUTO_JOB,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cluster", action="store_true", help="also on the test control plane (recovery_cluster.py)")
    parser.add_argument("--only", nargs="*", choices=list(CASES), help="these cases only (default: all)")
    args = parser.parse_args()
    cases = {case: CASES[case] for case in args.only or CASES}
    rows: dict[str, dict[str, list[dict[str, float]]]] = {case: {"in place": [], "restart": []} for case in cases}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            for (case, base), (label, in_place) in itertools.product(cases.items(), PATHS):
                folder = Path(tmp) / "-".join(f"{case} {label} {k}".replace(",", "").split())
                folder.mkdir()
                rows[case][label].append(run(folder, in_place=in_place, base=base))
    from bench.recovery_cluster import measure, show  # the cluster's side imports this file's JOB

    for case in cases:
        show(rows[case], case)
    if args.cluster:
        show(measure(args.runs), "cluster")


if __name__ == "__main__":
    main()
