"""What precision by measurement costs: the `auto` probe and the quality gate as a share of
training time, through `mpjob run` on this machine.

The quickstart's GPT (2 layers, 64 wide) for 300 steps in `auto` (the trainer times a step in
each precision the node supports before training) with the quality gate every 50 steps
(4 eval batches, in the attempt's precision and in fp32). From the trainer's event lines:
probe = from the `start` line to `precisionMeasured`; eval = the `eval` lines' seconds;
training = from `precisionMeasured` to `done`.

Usage: PYTHONPATH=. uv run python bench/precision_overhead.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

JOB = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "overhead"},
    "spec": {
        "task": {"builtin": "gpt", "args": {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 64}},
        "training": {"steps": 300, "batchSize": 16, "learningRate": 1.0e-3, "logEvery": 10},
        "precision": {"mode": "auto"},
        "validation": {"everySteps": 50, "maxLossDelta": 0.05, "batches": 4},
        "checkpoint": {"everySteps": 100},
        "resources": {"gpusPerWorker": 0},
    },
}


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        (tmp / "job.yaml").write_text(yaml.safe_dump(JOB))
        cmd = [sys.executable, "-m", "mpjob.cli", "run", str(tmp / "job.yaml"), "--out", str(tmp / "out"), "--plain"]
        subprocess.run(cmd, check=True, capture_output=True)
        log = (tmp / "out" / "attempts" / "a0" / "worker0.log").read_text().splitlines()
        events = [json.loads(line) for line in log if line.startswith("{")]
    at = {e["event"]: e for e in events if e["event"] in ("start", "precisionMeasured", "done")}
    probe = at["precisionMeasured"]["time"] - at["start"]["time"]
    training = at["done"]["time"] - at["precisionMeasured"]["time"]
    evals = [e for e in events if e["event"] == "eval"]
    eval_seconds = sum(e["seconds"] for e in evals)
    measured = at["precisionMeasured"]
    slower = measured["ampSlowerThanFp32"]
    print(f"auto chose {measured['chosen']} from {measured['stepSeconds']} (AMP slower: {slower})")
    print(f"probe        {probe:7.2f} s  = {probe / training:6.2%} of training ({training:.1f} s, 300 steps)")
    share = eval_seconds / training
    print(f"quality gate {eval_seconds:7.2f} s  = {share:6.2%} of training ({len(evals)} evaluations)")
    print(f"largest eval-loss delta vs fp32: {max(e['delta'] for e in evals):.4f}")


if __name__ == "__main__":
    main()
