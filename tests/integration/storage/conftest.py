"""The S3 tests' own place in the test cluster's bucket."""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import boto3
import pytest

from mpjob_contract.storage import S3Storage
from tests.cluster.s3 import CREDENTIALS, S3Server


@pytest.fixture
def s3(s3_server: S3Server, request: pytest.FixtureRequest) -> dict[str, Any]:
    """checkpoint.storage.s3 of a prefix no other test (or earlier run) writes below."""
    prefix = f"run-{request.node.name[:40].replace('[', '-').replace(']', '')}-{os.getpid()}-{time.time_ns()}"
    return {"bucket": s3_server.bucket, "endpoint": s3_server.endpoint, "prefix": prefix}


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test bucket's credentials and nothing else of the machine's AWS settings."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def settings(s3_server: S3Server, creds: None) -> S3Storage:
    """A bucket store's settings below a prefix of the test's own."""
    return S3Storage(bucket=s3_server.bucket, prefix=f"t-{uuid.uuid4().hex[:8]}", endpoint=s3_server.endpoint)


@pytest.fixture
def raw(settings: S3Storage) -> Any:
    """A plain client: what a person (or an older trainer) with the bucket's credentials can do
    behind the store's back."""
    return boto3.client("s3", endpoint_url=settings.endpoint, region_name=settings.region)
