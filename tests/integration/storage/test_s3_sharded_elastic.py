"""The rungs together: `mpjob run --workers-available` of an elastic fsdp (FSDP2) job whose sharded
checkpoints go to the test cluster's S3 server (gloo on the CPU, one process a worker): it shrinks
from 2 workers to 1 (the 1-process attempt resumes from shards 2 processes wrote to the bucket),
falls back from fp16 to bf16 after an overflow (resuming from a sharded checkpoint in the bucket)
and grows back to 2 (resharded the other way), keep-K pruning the bucket as it goes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import warm
from tests.helpers import NO_PLOT
from tests.integration.storage.test_s3_local_run import ARGS, committed_all_verify, env, job_folders, manifest, report
from tests.integration.storage.test_s3_sharded_run import SHARDED_OBJECTS, objects

pytestmark = pytest.mark.integration

STEPS, EVERY, KEEP = 24, 4, 2


def resumes(out: Path) -> dict[int, str]:
    """The checkpoint each attempt's rank 0 resumed from, by attempt index (its `resume` line)."""
    found: dict[int, str] = {}
    for log in sorted(out.glob("attempts/a*/worker0.log")):
        for line in log.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "resume":
                found[int(log.parent.name[1:])] = json.loads(line)["path"]
    return found


def test_an_elastic_fsdp_job_shrinks_falls_back_and_grows_through_sharded_checkpoints_in_a_bucket(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    job = manifest(
        tmp_path,
        s3,
        task={"builtin": "gpt", "args": {**ARGS, "nEmbd": 32, "overflowAtStep": 14}},
        training={"steps": STEPS, "batchSize": 4, "logEvery": 2},
        precision={"mode": "fp16", "fallback": ["bf16"]},
        checkpoint={"everySteps": EVERY, "keep": KEEP, "storage": {"s3": s3}},
        parallelism={"strategy": "fsdp"},
        workers=2,
        elastic={"minWorkers": 1},
    )
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain", *NO_PLOT]
    result = warm.run([*argv, "--workers-available", "2,10:1,18:2"], capture_output=True, text=True, timeout=540,
                      env=env())  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    status = report(out)
    attempts = status["attempts"]
    sizes = [a["worldSize"] for a in attempts]
    assert sizes[0] == 2 and 1 in sizes and sizes[-1] == 2, sizes  # shrunk, then grown back
    assert attempts[0]["precision"] == "fp16" and attempts[-1]["precision"] == "bf16"
    assert [a["reason"] for a in attempts if a["precision"] == "fp16"][-1] == "NumericFault"
    assert status["phase"] == "Succeeded" and status["lastCheckpoint"]["step"] == STEPS
    [folder] = job_folders(s3)
    taken = resumes(out)
    assert sorted(taken) == list(range(1, len(attempts)))  # every later attempt resumed, none from step 0
    for index, path in taken.items():
        assert path == f"{folder}/step-{attempts[index]['startStep']:09d}" and attempts[index]["startStep"] > 0
    assert objects(folder, s3)[f"step-{STEPS:09d}"] == SHARDED_OBJECTS  # the last attempt's 2 ranks' shards
    committed = committed_all_verify(folder, s3)
    assert len(committed) == KEEP and committed[-1] == STEPS, committed  # pruned whole as it went
