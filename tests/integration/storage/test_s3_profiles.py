"""A profile of a job whose checkpoints are in a bucket lands in that bucket, beside its
checkpoints, against the test cluster's real S3 server (versitygw); the attempt's older
traces are deleted there as its newer ones arrive."""

from __future__ import annotations

import gzip
import io
import json
import uuid
from typing import Any

import boto3
import pytest
import torch

from mpjob_contract.storage import S3Storage
from mpjob_trainer import profiling
from mpjob_trainer.checkpoint.bucket import open_bucket
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.profiling import ProfileCapture
from mpjob_trainer.profiling.places import BucketProfiles
from tests.cluster.s3 import CREDENTIALS, S3Server
from tests.unit.trainer.test_profiling import finished, train_steps

pytestmark = pytest.mark.integration


def test_profiles_go_to_the_jobs_folder_of_its_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(profiling, "KEPT_TRACES", 1)
    settings = S3Storage(bucket=s3_server.bucket, prefix=f"p-{uuid.uuid4().hex[:8]}", endpoint=s3_server.endpoint)
    place = BucketProfiles(f"{settings.url}/ns/job/uid", lambda: open_bucket(settings))
    metrics = TrainerMetrics("job", "ns", 0, "bf16")
    capture = ProfileCapture(place, device=torch.device("cpu"), log=EventLog(0, io.StringIO()), metrics=metrics)
    for profile_id in (1, 2):
        capture.ask(profile_id, 1)
        train_steps(capture, range(1, 4), low=True)
        done = finished(capture, profile_id, 1)
        assert done.state == "Captured", done.message
    assert done.path == f"{settings.url}/ns/job/uid/profiles/p2/trace.json.gz"
    raw: Any = boto3.client("s3", endpoint_url=settings.endpoint, region_name=settings.region)
    listed = raw.list_objects_v2(Bucket=settings.bucket, Prefix=f"{settings.prefix}/")
    keys = sorted(o["Key"] for o in listed.get("Contents", []))
    assert keys == [f"{settings.prefix}/ns/job/uid/profiles/p2/{n}" for n in ("summary.json", "trace.json.gz")]
    body = raw.get_object(Bucket=settings.bucket, Key=keys[1])["Body"].read()
    assert len(body) == done.trace_bytes and json.loads(gzip.decompress(body))["traceEvents"]
