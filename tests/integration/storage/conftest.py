"""The S3 tests' own place in the test cluster's bucket."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from tests.cluster.s3 import S3Server


@pytest.fixture
def s3(s3_server: S3Server, request: pytest.FixtureRequest) -> dict[str, Any]:
    """checkpoint.storage.s3 of a prefix no other test (or earlier run) writes below."""
    prefix = f"run-{request.node.name[:40].replace('[', '-').replace(']', '')}-{os.getpid()}-{time.time_ns()}"
    return {"bucket": s3_server.bucket, "endpoint": s3_server.endpoint, "prefix": prefix}
