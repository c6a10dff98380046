"""`mpjob run --workers-available` of an elastic job (spec.elastic) on 3 DDP processes (gloo):
a node lost at step 20 shrinks it to 2 workers from the last checkpoint in the same precision,
an fp16 fault on 2 workers falls back to bf16 on 2, and when the third worker fits again at
step 60 the job grows back to 3 at its next checkpoint. The global batch stays 12 samples at
every size, and across every change the samples trained are exactly the data stream's: none
twice, none skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob_trainer.data import StepSampler
from tests import warm
from tests.helpers import NO_PLOT

pytestmark = pytest.mark.unit

SAMPLES, SEED, STEPS, GLOBAL_BATCH = 96, 0, 80, 12
JOB: dict[str, Any] = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "elastic"},
    "spec": {
        "workers": 3,
        "task": {
            "module": "tests.unit.localrun.elastic_task:make_task",
            "args": {"samples": SAMPLES, "overflowAtStep": 35},
        },
        "training": {"steps": STEPS, "batchSize": 4, "logEvery": 1, "learningRate": 1e-3, "seed": SEED},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": 10, "keep": 3},
        "elastic": {"minWorkers": 2},
        "resources": {"gpusPerWorker": 0},
    },
}


def run(tmp: Path, *args: str, job: dict[str, Any] = JOB) -> tuple[subprocess.CompletedProcess[str], Path]:
    (tmp / "job.yaml").write_text(yaml.safe_dump(job))
    record = tmp / "samples.txt"
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1", "MPJOB_TEST_RECORD": str(record)})
    command = [sys.executable, "-m", "mpjob.cli", "run", str(tmp / "job.yaml"), "--out", str(tmp / "out")]
    return warm.run([*command, *args, *NO_PLOT], capture_output=True, text=True, timeout=540, env=env), record


def trained(attempts: list[dict[str, Any]], record: Path) -> Counter[int]:
    """The samples of the steps each attempt handed on (from its start to the next one's), read
    per process in the order it served them; what a later attempt trained again is left out."""
    served: dict[tuple[int, int], list[int]] = defaultdict(list)
    for line in record.read_text().splitlines():
        attempt, rank, index = (int(x) for x in line.split())
        served[(attempt, rank)].append(index)
    lineage: Counter[int] = Counter()
    for n, attempt in enumerate(attempts):
        stop = attempts[n + 1]["startStep"] if n + 1 < len(attempts) else attempt["endStep"]
        per_process = (stop - attempt["startStep"]) * attempt["microBatch"] * attempt["gradAccumulation"]
        for rank in range(attempt["worldSize"]):
            mine = served[(attempt["index"], rank)]
            assert len(mine) >= per_process, (attempt["index"], rank, len(mine), per_process)
            lineage.update(mine[:per_process])
    return lineage


def events(log: Path) -> list[dict[str, Any]]:
    """The trainer's event lines in a worker's log."""
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def stream(count: int) -> Counter[int]:
    """The first `count` samples of the job's data order (one process, one sample a step)."""
    order = StepSampler(SAMPLES, 1, 1, 1, 0, SEED)
    return Counter(order.indices(k, 0)[0] for k in range(count))


@pytest.mark.process
def test_an_elastic_run_shrinks_falls_back_and_grows_with_the_data_position_exact(tmp_path: Path) -> None:
    result, record = run(tmp_path, "--plain", "--workers-available", "3,20:2,60:3")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    attempts = report["attempts"]
    assert [(a["precision"], a["worldSize"], a["reason"], a["charged"]) for a in attempts] == [
        ("fp16", 3, "ScaledDown", False),
        ("fp16", 2, "NumericFault", True),
        ("bf16", 2, "ScaledUp", False),
        ("bf16", 3, "Succeeded", True),
    ]
    assert (report["phase"], report["step"], report["workers"]) == ("Succeeded", STEPS, 3)
    # Shrunk at the node loss from the newest checkpoint the first attempt wrote: the runner kills
    # the lost worker's processes once it reads step 20 or later, so the save at the last interval
    # they reached may be cut (then the one before it), and rank 0 may save where the peer watch
    # stopped it (a step between intervals); grown at a checkpoint after step 60.
    written = [
        e["step"] for e in events(tmp_path / "out" / "attempts" / "a0" / "worker0.log") if e["event"] == "checkpoint"
    ]
    assert attempts[0]["endStep"] >= 20 and attempts[1]["startStep"] == max(written), written
    assert attempts[2]["startStep"] == 30
    assert attempts[3]["startStep"] >= 60 and attempts[3]["startStep"] == attempts[2]["endStep"]
    for a in attempts:  # the global batch, whatever the size: workers x micro-batch x accumulation
        assert a["worldSize"] * a["microBatch"] * a["gradAccumulation"] == GLOBAL_BATCH
    assert trained(attempts, record) == stream(STEPS * GLOBAL_BATCH)


@pytest.mark.process
def test_an_fsdp_job_shrinks_and_grows_resharding_its_checkpoints_with_the_data_position_exact(tmp_path: Path) -> None:
    """The same under fsdp (FSDP2): each size change reshards the sharded checkpoint 3 -> 2 -> 3."""
    spec = {**JOB["spec"], "parallelism": {"strategy": "fsdp"}, "precision": {"mode": "bf16", "fallback": ["fp32"]}}
    spec["task"] = {**spec["task"], "args": {"samples": SAMPLES}}
    spec["training"] = {**spec["training"], "steps": 50}
    result, record = run(tmp_path, "--plain", "--workers-available", "3,20:2,35:3", job={**JOB, "spec": spec})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    attempts = report["attempts"]
    assert [(a["worldSize"], a["reason"], a["charged"]) for a in attempts] == [
        (3, "ScaledDown", False),
        (2, "ScaledUp", False),  # grown only once 3 fit again (step 35), not on steps trained again
        (3, "Succeeded", True),
    ]
    assert attempts[1]["startStep"] in (10, 20) and attempts[2]["startStep"] >= 35  # the checkpoints before each
    wrap = [json.loads(line) for line in (tmp_path / "out/attempts/a1/worker0.log").read_text().splitlines()
            if line.startswith('{"event": "wrap"')]  # fmt: skip
    assert wrap and wrap[0]["strategy"] == "fsdp"
    assert trained(attempts, record) == stream(50 * GLOBAL_BATCH)


def test_a_schedule_below_min_workers_or_without_elastic_is_refused(tmp_path: Path) -> None:
    result, _ = run(tmp_path, "--workers-available", "3,20:1")
    assert result.returncode == 2 and "fewer than elastic.minWorkers=2" in result.stdout
    result, _ = run(tmp_path, "--workers-available", "3,x")
    assert result.returncode == 2 and "expected N[,STEP:N]..." in result.stdout
