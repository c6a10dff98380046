"""`mpjob run` with checkpoint.storage.s3 against the test cluster's S3 server: the fp16 ->
bf16 fallback resumes from the bucket; a run SIGKILLed at random moments (uploads in flight)
never leaves a partially visible checkpoint and, rerun, ends bit-identical to a straight run;
a wrong credential or a missing bucket fails the job in one attempt, naming the bucket."""

from __future__ import annotations

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch
import yaml

from mpjob_contract.storage import S3Storage, split_url
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests import warm
from tests.cluster.s3 import CREDENTIALS
from tests.helpers import NO_PLOT, wait_for

pytestmark = pytest.mark.integration

ARGS = {"nLayer": 2, "nHead": 2, "nEmbd": 64, "blockSize": 32, "corpusBytes": 20000}
#: ~3.4 M parameters: a ~40 MiB checkpoint with AdamW state, uploaded in 16 MiB parts.
BIG = {**ARGS, "nLayer": 4, "nHead": 4, "nEmbd": 256}


def manifest(tmp: Path, s3: dict[str, Any], name: str = "s3run", **spec: Any) -> Path:
    doc = {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": name},
        "spec": {
            "task": {"builtin": "gpt", "args": ARGS},
            "training": {"steps": 40, "batchSize": 4, "logEvery": 5},
            "precision": {"mode": "bf16", "fallback": ["fp32"]},
            "checkpoint": {"everySteps": 4, "keep": 3, "storage": {"s3": s3}},
            "resources": {"gpusPerWorker": 0},
            **spec,
        },
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def env(*, frameworks: bool = False, **override: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    ours = {**base, **CREDENTIALS, "AWS_EC2_METADATA_DISABLED": "true", "OMP_NUM_THREADS": "1", **override}
    return warm.for_ranks(ours, frameworks=frameworks)  # `mpjob run`'s ranks start warm


def mpjob_run(
    job: Path, out: Path, timeout: float = 300, *, frameworks: bool = False, **override: str
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain", *NO_PLOT]
    return warm.run(argv, capture_output=True, text=True, timeout=timeout, env=env(frameworks=frameworks, **override))


def report(out: Path) -> dict[str, Any]:
    return dict(json.loads((out / "report.json").read_text()))


def client(s3: dict[str, Any]) -> Any:
    keys = {
        "aws_access_key_id": CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    }
    return boto3.client("s3", endpoint_url=s3["endpoint"], region_name="us-east-1", **keys)


def job_folders(s3: dict[str, Any]) -> list[str]:
    """The `s3://` folders of the jobs below the test's prefix (one per `--out`)."""
    pages = client(s3).get_paginator("list_objects_v2").paginate(Bucket=s3["bucket"], Prefix=f"{s3['prefix']}/")
    keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    return sorted({f"s3://{s3['bucket']}/" + k.split("/step-")[0] for k in keys if "/step-" in k})


def committed_all_verify(folder: str, s3: dict[str, Any]) -> list[int]:
    """Every committed checkpoint of `folder` verifies (files there, sha256 right); their steps."""
    bucket, key = split_url(folder)
    c = client(s3)
    steps = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{key}/"):
        for obj in page.get("Contents", []):
            if obj["Key"].endswith("/manifest.json") and "/.corrupt/" not in obj["Key"]:
                manifest = json.loads(c.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
                steps.append((obj["Key"].rsplit("/", 2)[-2], manifest))
    os.environ.update(CREDENTIALS)
    verified = []
    for name, manifest in steps:
        store = BucketCheckpointStore(
            folder, S3Storage(**s3), keep=100, config_digest=manifest["configDigest"], job=manifest["job"]
        )
        ref, _ = store.verify(f"{folder}/{name}")
        verified.append(ref.step)
    return sorted(verified)


def state_of(path: str, s3: dict[str, Any]) -> dict[str, Any]:
    bucket, key = split_url(path)
    written = json.loads(client(s3).get_object(Bucket=bucket, Key=f"{key}/manifest.json")["Body"].read())
    body = client(s3).get_object(Bucket=bucket, Key=f"{key}/{written['writer']}/state.pt")["Body"].read()
    return dict(torch.load(io.BytesIO(body), weights_only=True))


def assert_identical(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    sa, sb = a["optimizer"]["state"], b["optimizer"]["state"]
    assert sa.keys() == sb.keys()
    for pid in sa:
        for name, value in sa[pid].items():
            assert torch.equal(value, sb[pid][name]), (pid, name)
    assert a["step"] == b["step"]


def test_fp16_overflow_resumes_in_bf16_from_the_buckets_last_committed_checkpoint(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    job = manifest(
        tmp_path,
        s3,
        task={"builtin": "gpt", "args": {**ARGS, "overflowAtStep": 15}},
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]},
    )
    result = mpjob_run(job, tmp_path / "out")
    assert result.returncode == 0, result.stdout + result.stderr
    status = report(tmp_path / "out")
    first, second = status["attempts"]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded") and second["startStep"] > 0
    assert status["lastCheckpoint"]["path"].startswith(f"s3://{s3['bucket']}/{s3['prefix']}/local/s3run/local-")
    [folder] = job_folders(s3)
    assert committed_all_verify(folder, s3) == [32, 36, 40]  # keep: 3


def uploads_in_flight(s3: dict[str, Any]) -> int:
    """Multipart uploads begun and not completed below the test's prefix."""
    found = client(s3).list_multipart_uploads(Bucket=s3["bucket"], Prefix=f"{s3['prefix']}/")
    return len(found.get("Uploads", []))


def test_sigkill_during_uploads_never_shows_a_partial_checkpoint_and_the_rerun_is_bit_identical(
    tmp_path: Path, s3: dict[str, Any]
) -> None:
    """Checkpoints of ~40 MiB (multipart: 16 MiB parts) every 4 steps of 16 keep the writer
    thread uploading most of the time; each run is killed (its whole process group) a random few
    milliseconds after an upload was seen in flight, three times (the first at once: the moment
    this test is about, which a delay lets the upload outrun), then rerun to the end."""
    training = {"steps": 16, "batchSize": 4, "logEvery": 4}
    # fp32: the uploads are what this is about, and a bf16 step on the CPU costs 2-5x an fp32 one.
    precision = {"mode": "fp32"}
    job = manifest(tmp_path, s3, task={"builtin": "gpt", "args": BIG}, training=training, precision=precision)
    straight = mpjob_run(job, tmp_path / "straight")
    assert straight.returncode == 0, straight.stdout + straight.stderr
    reference = report(tmp_path / "straight")["lastCheckpoint"]["path"]

    out, rng = tmp_path / "cut", random.Random(0)
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain"]
    kills, torn = 0, 0
    for delay in (0.0, rng.uniform(0.0, 0.2), rng.uniform(0.0, 0.2)):
        proc = warm.Popen(argv, env=env(), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for(
            lambda run=proc: run.poll() is not None or uploads_in_flight(s3) > 0,
            240,
            interval=0.02,
            message="an upload in flight",
        )
        time.sleep(delay)
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        kills += 1
        torn += uploads_in_flight(s3) > 0  # killed mid-upload: its parts are there, uncommitted
        for folder in job_folders(s3):
            committed_all_verify(folder, s3)  # whatever is committed verifies: nothing half-visible
    assert kills == 3 and torn >= 1, (kills, torn)
    rerun = mpjob_run(job, out)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    final = report(out)
    assert final["phase"] == "Succeeded" and final["lastCheckpoint"]["step"] == training["steps"]
    assert_identical(state_of(reference, s3), state_of(final["lastCheckpoint"]["path"], s3))
    assert uploads_in_flight(s3) == 0  # the rerun aborted what the killed runs left


@pytest.mark.parametrize("wrong", ["credential", "bucket"])
def test_a_wrong_credential_or_a_missing_bucket_fails_the_job_in_one_attempt_naming_the_bucket(
    tmp_path: Path, s3: dict[str, Any], wrong: str
) -> None:
    if wrong == "bucket":
        s3 = {**s3, "bucket": "no-such-checkpoint-bucket"}
    job = manifest(tmp_path, s3)
    override = {"AWS_SECRET_ACCESS_KEY": "wrong-secret"} if wrong == "credential" else {}
    started = time.monotonic()
    result = mpjob_run(job, tmp_path / "out", timeout=180, **override)
    assert result.returncode == 1, result.stdout + result.stderr
    assert time.monotonic() - started < 120
    status = report(tmp_path / "out")
    assert status["phase"] == "Failed" and len(status["attempts"]) == 1
    assert status["attempts"][0]["reason"] == "ConfigError"
    assert s3["bucket"] in status["attempts"][0]["message"]


def test_every_ranks_framework_files_are_in_the_buckets_checkpoints(tmp_path: Path, s3: dict[str, Any]) -> None:
    """A real HF Trainer job on 2 processes: each checkpoint the bucket commits names, and holds
    whole, every rank's RNG state (the Trainer's rng_state_<rank>.pth, which each rank writes into
    its own spool); before, rank 1's stayed in its spool and the checkpoint went up without it."""
    script = Path(__file__).parents[2] / "unit" / "trainer" / "hf_ranks_script.py"
    job = manifest(
        tmp_path,
        s3,
        task={"command": [sys.executable, str(script)]},
        training={"steps": 4, "batchSize": 4, "logEvery": 1},
        checkpoint={"everySteps": 2, "keep": 3, "storage": {"s3": s3}},
        resources={"gpusPerWorker": 0, "processesPerWorker": 2},
    )
    result = mpjob_run(job, tmp_path / "out", frameworks=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder,) = job_folders(s3)
    assert {2, 4} <= set(committed_all_verify(folder, s3))  # every file of each is there, its sha256 right
    bucket, key = split_url(folder)
    for step in (2, 4):
        name = f"{key}/step-{step:09d}/manifest.json"
        files = json.loads(client(s3).get_object(Bucket=bucket, Key=name)["Body"].read())["files"]
        rng = sorted(f.rsplit("/", 1)[-1] for f in files if "rng_state" in f)
        assert rng == ["rng_state_0.pth", "rng_state_1.pth"], sorted(files)
