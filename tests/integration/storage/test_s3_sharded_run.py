"""Sharded (fsdp) checkpoints in an S3 bucket, against the test cluster's S3 server, with two
processes (gloo on the CPU): `mpjob run` of an fsdp fp16 job overflows and resumes in bf16 from
a sharded checkpoint in the bucket, every rank's shards under the step's prefix; runs SIGKILLed
while shards are going up never leave a checkpoint that looks whole, and rerun end bit-identical
to a straight run; a checkpoint two processes wrote to the bucket resumes on one (resharded)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from mpjob_contract.storage import split_url
from tests import warm
from tests.cluster.s3 import CREDENTIALS
from tests.helpers import rendezvous, wait_for
from tests.integration.storage.test_s3_local_run import (
    ARGS,
    client,
    committed_all_verify,
    env,
    job_folders,
    manifest,
    mpjob_run,
    report,
)
from tests.unit.trainer.conftest import launch_env, parse, spec
from tests.unit.trainer.test_own_loop_resume import assert_identical

pytestmark = pytest.mark.integration

FSDP = {"parallelism": {"strategy": "fsdp"}, "resources": {"gpusPerWorker": 0, "processesPerWorker": 2}}
#: What every rank of two leaves under a sharded checkpoint's prefix, and the commit.
#: A writer's own folder below a step's prefix; a step folder and an object's name below it.
WRITER, STEP = re.compile(r"^w-[0-9a-f]{12}/"), re.compile(r"^(.*/step-[0-9]{9})/(.*)$")
SHARDED_OBJECTS = {".metadata", "__0_0.distcp", "__1_0.distcp", "rank-00000.pt", "rank-00001.pt", "manifest.json"}
SCRIPT = Path(__file__).resolve().parents[2] / "unit" / "trainer" / "sharded_script.py"
RANKS = Path(__file__).with_name("sharded_bucket_ranks.py")


def objects(folder: str, s3: dict[str, Any], since: float = 0.0) -> dict[str, set[str]]:
    """The object names below each step folder of the job `folder` (last written at `since` or
    later), as a manifest names them (its writer's folder left out)."""
    bucket, key = split_url(folder)
    pages = client(s3).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/")
    found: dict[str, set[str]] = {}
    for page in pages:
        for obj in page.get("Contents", []):
            if obj["LastModified"].timestamp() >= since:
                step, name = obj["Key"][len(key) + 1 :].split("/", 1)
                found.setdefault(step, set()).add(WRITER.sub("", name))
    return found


def uncommitted(s3: dict[str, Any], since: float = 0.0) -> int:
    """Step folders below the test's prefix holding objects (one written since `since`) but no
    manifest (one listing: the test polls this while shards go up)."""
    pages = client(s3).get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"], Prefix=f"{s3['prefix']}/")
    names: dict[str, set[str]] = {}
    recent: set[str] = set()
    for page in pages:
        for obj in page.get("Contents", []):
            folder, name = m.groups() if (m := STEP.match(obj["Key"])) else ("", "")  # a step's, any writer's
            names.setdefault(folder, set()).add(name)
            if obj["LastModified"].timestamp() >= since:
                recent.add(folder)
    return sum("manifest.json" not in names[folder] for folder in recent if "/step-" in folder)


def contents(path: str, s3: dict[str, Any], into: Path) -> dict[str, Any]:
    """A sharded checkpoint of the bucket as plain tensors (DCP's shards joined) and its rank files."""
    bucket, key = split_url(path)
    into.mkdir(parents=True)
    written = json.loads(client(s3).get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read())
    for name in written["files"]:
        client(s3).download_file(bucket, f"{key}/{written['writer']}/{name}", str(into / name))
    dcp_to_torch_save(into, into / "joined.pt")
    ranks = {p.name: torch.load(p, weights_only=True) for p in sorted(into.glob("rank-*.pt"))}
    return {"shards": torch.load(into / "joined.pt", weights_only=True), "ranks": ranks}


def test_fsdp_fp16_overflow_resumes_in_bf16_from_every_ranks_shards_in_the_bucket(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    job = manifest(
        tmp_path,
        s3,
        task={"builtin": "gpt", "args": {**ARGS, "overflowAtStep": 8}},
        training={"steps": 16, "batchSize": 4, "logEvery": 4},
        precision={"mode": "fp16", "fallback": ["bf16"]},
        checkpoint={"everySteps": 4, "keep": 2, "storage": {"s3": s3}},
        **FSDP,
    )
    result = mpjob_run(job, tmp_path / "out")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    status = report(tmp_path / "out")
    first, second = status["attempts"]
    assert (first["precision"], first["reason"], first["worldSize"]) == ("fp16", "NumericFault", 2)
    assert (second["precision"], second["reason"], second["worldSize"]) == ("bf16", "Succeeded", 2)
    assert 0 < second["startStep"] <= 8  # from a sharded checkpoint the fp16 attempt committed
    assert status["phase"] == "Succeeded" and status["lastCheckpoint"]["step"] == 16
    [folder] = job_folders(s3)
    assert status["lastCheckpoint"]["path"] == f"{folder}/step-000000016"
    found = objects(folder, s3)
    assert found["step-000000016"] == SHARDED_OBJECTS  # each rank's own shards, no gather
    assert committed_all_verify(folder, s3) == [12, 16]  # keep: 2, the older ones pruned whole
    assert {step for step, names in found.items() if "manifest.json" in names} == {"step-000000012", "step-000000016"}


def test_sigkill_while_shards_go_up_never_shows_a_partial_checkpoint_and_the_rerun_is_bit_identical(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    """Each rank's shard is ~20 MiB (multipart: 16 MiB parts) uploaded every 2 steps; each of up
    to three runs is killed (its whole process group) when a step's objects are seen without a
    manifest (the first kill at once, the others a random moment later), then rerun to the end."""
    big = {**ARGS, "nLayer": 4, "nHead": 4, "nEmbd": 256}
    training = {"steps": 6, "batchSize": 4, "logEvery": 3}
    checkpoint = {"everySteps": 2, "keep": 2, "storage": {"s3": s3}}
    # fp32: the uploads are what this is about, and a bf16 step on the CPU costs 2-5x an fp32 one.
    precision = {"mode": "fp32"}
    job = manifest(tmp_path, s3, task={"builtin": "gpt", "args": big}, training=training, checkpoint=checkpoint,
                   precision=precision, **FSDP)  # fmt: skip
    straight = mpjob_run(job, tmp_path / "straight")
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]
    reference = report(tmp_path / "straight")["lastCheckpoint"]["path"]

    out, rng = tmp_path / "cut", random.Random(0)
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain"]
    kills, torn = 0, 0
    for delay in (0.0, rng.uniform(0.0, 0.1), rng.uniform(0.0, 0.1)):
        proc = warm.Popen(argv, env=env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        since = float(int(time.time()))  # S3 times objects to the second: this run's are not older
        wait_for(
            lambda run=proc, t=since: run.poll() is not None or uncommitted(s3, t) > 0,
            300,
            interval=0.1,  # a listing of the whole prefix each time; a shard takes longer to go up
            message="shards going up",
        )
        time.sleep(delay)
        if proc.poll() is not None:
            assert proc.returncode == 0, f"run {kills + 1} ended {proc.returncode} before it was killed"
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
        torn += uncommitted(s3) > 0  # objects of a step there, without its manifest: not a checkpoint
        for folder in job_folders(s3):
            committed_all_verify(folder, s3)  # whatever is committed is whole
    # A run resumed near the end can finish between two listings, before its kill: fewer kills
    # then, but at least one run was cut with a step's shards going up.
    assert kills >= 1 and torn >= 1, (kills, torn)
    rerun = mpjob_run(job, out)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    final = report(out)
    assert final["phase"] == "Succeeded" and final["lastCheckpoint"]["step"] == training["steps"]
    ours = contents(final["lastCheckpoint"]["path"], s3, tmp_path / "resumed")
    assert_identical(contents(reference, s3, tmp_path / "reference"), ours)


def test_a_checkpoint_two_processes_wrote_to_the_bucket_resumes_on_one(tmp_path: Path, s3: dict[str, Any]) -> None:
    steps = 6
    job = spec(
        task={"command": ["python", SCRIPT.name], "args": {"blocks": 3, "width": 32}},
        training={"steps": steps, "logEvery": 3, "seed": 1},
        precision={"mode": "bf16"},
        checkpoint={"everySteps": 3, "keep": 2, "storage": {"s3": s3}},
    )
    where = f"s3://{s3['bucket']}/{s3['prefix']}/t/uid"

    def launch(nproc: int, dump: Path) -> list[dict[str, Any]]:
        extra = {**CREDENTIALS, "AWS_EC2_METADATA_DISABLED": "true", "SHARDED_SCRIPT_FULL_STATE": str(dump)}
        launcher = [sys.executable, "-m", "mpjob_trainer.launch", "--nproc-per-worker", str(nproc), "--workers", "1"]
        argv = [*launcher, "--", sys.executable, str(SCRIPT)]
        with rendezvous(nproc) as meet:
            run_env = launch_env(tmp_path, job, "bf16", extra={**extra, **meet}, name=f"report-{nproc}.json")
            run_env["MPJOB_LAUNCH"] = run_env["MPJOB_LAUNCH"].replace(str(tmp_path / "ckpt"), where)
            proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        return parse(proc.stdout)

    launch(2, tmp_path / "two.pt")
    assert objects(where, s3)[f"step-{steps:09d}"] == SHARDED_OBJECTS
    events = launch(1, tmp_path / "one.pt")
    assert [e["step"] for e in events if e["event"] == "resume"] == [steps]
    resumed = torch.load(tmp_path / "one.pt", weights_only=True)
    assert resumed["optimizer"]["state"], "the optimizer state came back"
    assert_identical(torch.load(tmp_path / "two.pt", weights_only=True), resumed, "on 1")


def test_a_rank_that_cannot_upload_leaves_no_manifest_and_another_jobs_step_is_never_written(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    """ShardedWriter on two ranks (sharded_bucket_ranks.py): the ranks agree on every upload
    before rank 0 commits, and rank 0 checks the step's place before any rank uploads; a
    damaged shard in the bucket makes both ranks resume from the previous good checkpoint."""
    where = f"s3://{s3['bucket']}/{s3['prefix']}/ns/job/uid"
    bucket, key = split_url(where)
    other = {"x.bin": {"sha256": hashlib.sha256(b"abc").hexdigest(), "bytes": 3}}
    doc = {"formatVersion": 2, "step": 6, "precision": "bf16", "configDigest": "digest", "job": "ns/other/uid"}
    planted = {"x.bin": b"abc", "manifest.json": json.dumps({**doc, "layout": "dcp", "files": other}).encode()}
    for name, body in planted.items():
        client(s3).put_object(Bucket=bucket, Key=f"{key}/step-000000006/{name}", Body=body)
    ranks = [
        subprocess.Popen(
            [sys.executable, str(RANKS), str(rank), str(tmp_path), where, s3["endpoint"], s3["bucket"]],
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    for proc in ranks:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output[-4000:]
    seen = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in seen:
        assert rank["saved"] == f"{where}/step-000000002"
        assert rank["refused"].startswith("OSError: ") and "rank 1: OSError: injected" in rank["refused"]
        assert rank["taken"].startswith("CheckpointTaken: ")
        assert rank["damaged"] == f"{where}/step-000000008"
        assert rank["resumed"] == 2  # 8 is damaged, 4 was never committed, 6 is not a checkpoint of ours
    for r, rank in enumerate(seen):  # verified: DCP's index, its own shards and rank file only
        assert rank["fetched"] == sorted({".metadata", "manifest.json", f"__{r}_0.distcp", f"rank-0000{r}.pt"})
    found = objects(where, s3)
    assert found["step-000000002"] == SHARDED_OBJECTS
    assert "step-000000004" not in found  # rank 1 could not upload: rank 0's shards withdrawn too
    assert found["step-000000006"] == set(planted)  # nothing uploaded over another job's checkpoint
    for name, body in planted.items():
        assert client(s3).get_object(Bucket=bucket, Key=f"{key}/step-000000006/{name}")["Body"].read() == body
