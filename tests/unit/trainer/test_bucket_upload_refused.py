"""An upload the bucket refuses is sorted as every other request's refusal (checkpoint.bucket):
one no retry fixes (403 AccessDenied: credentials that may read and not write, a bucket policy,
an SSE-KMS key the job may not use) is BucketMisconfigured, a ConfigError naming the bucket, so
the attempt ends with the configuration-error exit code instead of failing every save and being
retried; a server error is BucketFailed, naming the bucket and the key.

boto3's upload_file raises S3UploadFailedError, which carries no answer of the server, while
handling the ClientError that does: the bucket here is the store's real Bucket over a real boto3
client, its answers stubbed (botocore's Stubber: no request leaves the process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
import torch
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.stub import Stubber

from mpjob_trainer.checkpoint.bucket import Bucket, BucketFailed, BucketMisconfigured
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from tests.unit.trainer.memory_bucket import SETTINGS

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"


@pytest.fixture
def answers() -> Iterator[tuple[Bucket, Stubber]]:
    """The store's Bucket over a boto3 client whose answers the test gives (Stubber)."""
    session = boto3.session.Session(aws_access_key_id="test-key", aws_secret_access_key="test-secret")
    config = Config(region_name="us-east-1", s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    client = session.client("s3", endpoint_url=SETTINGS.endpoint, config=config)
    with Stubber(client) as stubber:
        yield Bucket(SETTINGS, client, TransferConfig(use_threads=False)), stubber


def _put_refused(stubber: Stubber, code: str, status: int) -> None:
    stubber.add_client_error("put_object", service_error_code=code, service_message=code, http_status_code=status)


@pytest.mark.parametrize(
    ("code", "status", "raised", "said"),
    [("AccessDenied", 403, BucketMisconfigured, "refused"), ("InternalError", 500, BucketFailed, "failed")],
    ids=["forbidden-is-misconfigured", "server-error-is-a-failed-request"],
)
def test_an_upload_the_bucket_answers_with_an_error_is_said_by_its_answer_naming_the_bucket(
    answers: tuple[Bucket, Stubber], tmp_path: Path, code: str, status: int, raised: type[Exception], said: str
) -> None:
    """upload_file raises S3UploadFailedError, which carries no answer, while handling the
    ClientError that does: the answer's code says which, as for every other request."""
    bucket, stubber = answers
    _put_refused(stubber, code, status)
    (tmp_path / "state.pt").write_bytes(b"state")
    with pytest.raises(raised, match=rf"{SETTINGS.bucket!r} .*{said} to store runs/k/state.pt: {code}"):
        bucket.upload("runs/k/state.pt", tmp_path / "state.pt")


def test_a_save_to_a_bucket_that_forbids_writes_ends_as_a_configuration_error(
    answers: tuple[Bucket, Stubber],
) -> None:
    bucket, stubber = answers
    stubber.add_client_error("get_object", service_error_code="NoSuchKey", http_status_code=404)  # step 10: free
    _put_refused(stubber, "AccessDenied", 403)
    stubber.add_response("delete_object", {})  # what the refused upload may have left: withdrawn
    store = BucketCheckpointStore(f"{SETTINGS.url}/{JOB}", SETTINGS, keep=3, config_digest="d1", job=JOB, bucket=bucket)
    with pytest.raises(BucketMisconfigured, match="AccessDenied"):
        store.write(10, "fp32", {"step": 10, "model": {"w": torch.zeros(2)}})
    stubber.assert_no_pending_responses()
