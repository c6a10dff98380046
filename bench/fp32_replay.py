"""What the fp32 replay costs and what it saves, through `mpjob run` on this machine.

Two jobs, each with the replay on (guard.replaySteps 4) and off (0):
- poisoned: a GPT-shaped workload whose data holds NaN samples (`mlp` with
  nonFiniteSamples, sized to take ~0.1 s a step). Replay on: one attempt, then Failed
  NonFiniteInFp32. Off: one attempt per precision (fp16, bf16, fp32), then NoPrecisionLeft.
- overflow: the quickstart's fp16 activation overflow. On or off it falls back to bf16 and
  succeeds; the replay adds its seconds to the fp16 attempt's ending.
Prints wall time to the job's end, attempts used and the replay's own seconds.

Usage: PYTHONPATH=. uv run python bench/fp32_replay.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

POISONED = {
    "task": {
        "builtin": "mlp",
        "args": {"inputs": 256, "hidden": 1024, "layers": 4, "samples": 512, "nonFiniteSamples": [100]},
    },
    "training": {"steps": 200, "batchSize": 32, "logEvery": 5},
    "checkpoint": {"everySteps": 10},
}
OVERFLOW = {
    "task": {"builtin": "gpt", "args": {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 64, "overflowAtStep": 120}},
    "training": {"steps": 300, "batchSize": 16, "learningRate": 1.0e-3, "logEvery": 10},
    "checkpoint": {"everySteps": 50},
}


def run(tmp: Path, name: str, spec: dict, replay_steps: int) -> dict:
    body = {
        **spec,
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"], "guard": {"replaySteps": replay_steps}},
        "resources": {"gpusPerWorker": 0},
    }
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": name}, "spec": body}
    job = tmp / f"{name}-{replay_steps}.yaml"
    job.write_text(yaml.safe_dump(doc))
    out = tmp / f"out-{name}-{replay_steps}"
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain"], capture_output=True
    )
    seconds = time.perf_counter() - began
    report = json.loads((out / "report.json").read_text())
    replays = [json.loads(p.read_text()).get("replay") for p in sorted(out.rglob("termination-worker0.json"))]
    replay_seconds = sum(r["seconds"] for r in replays if r)
    reason = next(c["reason"] for c in report["conditions"] if c["type"] == report["phase"])
    return {
        "phase": report["phase"],
        "reason": reason,
        "attempts": len(report["attempts"]),
        "seconds": seconds,
        "replay": replay_seconds,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        print(f"{'job':<10} {'replay':<7} {'end':<30} {'attempts':>8} {'wall s':>8} {'replay s':>9}")
        for name, spec in (("poisoned", POISONED), ("overflow", OVERFLOW)):
            for steps in (4, 0):
                r = run(tmp, name, spec, steps)
                end, mode = f"{r['phase']} {r['reason']}", "on" if steps else "off"
                figures = f"{r['attempts']:>8} {r['seconds']:>8.1f} {r['replay']:>9.2f}"
                print(f"{name:<10} {mode:<7} {end:<30} {figures}")


if __name__ == "__main__":
    main()
