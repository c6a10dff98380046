"""checkpoint.storage: where a job's checkpoints live, one rule for both the operator and the
local runner (the same per-job folder below a volume's mount or a bucket's prefix)."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from mpjob.validation import check_text
from mpjob_contract.api import Checkpoint
from mpjob_contract.launch import CHECKPOINT_MOUNT, checkpoint_root, inside_checkpoint_dir, job_checkpoint_dir
from mpjob_contract.storage import S3Storage, is_bucket_url, split_url
from tests.unit.operator.cases import bad

pytestmark = pytest.mark.unit

S3 = {"bucket": "ckpt", "endpoint": "http://s3:7070"}


def test_the_bucket_root_takes_the_same_per_job_folder_rule_as_a_volume() -> None:
    folder = job_checkpoint_dir(namespace="ml", name="gpt", uid="u-1", root=S3Storage(**S3, prefix="a/b").url)
    assert folder == "s3://ckpt/a/b/ml/gpt/u-1"
    assert split_url(folder) == ("ckpt", "a/b/ml/gpt/u-1") and is_bucket_url(folder)
    assert inside_checkpoint_dir(f"{folder}/step-000000020", folder)
    assert not inside_checkpoint_dir("s3://ckpt/a/b/ml/other/u-2/step-000000020", folder)
    assert not inside_checkpoint_dir(f"{folder}/../../other/u-2/step-000000020", folder)


def test_the_spec_says_which_root() -> None:
    from mpjob_contract.api import MixedPrecisionJobSpec

    on_volume = MixedPrecisionJobSpec.model_validate({"task": {"builtin": "gpt"}})
    in_bucket = MixedPrecisionJobSpec.model_validate(
        {"task": {"builtin": "gpt"}, "checkpoint": {"storage": {"s3": S3}}}
    )
    assert checkpoint_root(on_volume) == CHECKPOINT_MOUNT
    assert checkpoint_root(in_bucket) == "s3://ckpt/mpjob"


def test_storage_volume_is_the_volume_checkpoints_go_to() -> None:
    claim = {"persistentVolumeClaim": {"claimName": "c"}}
    assert (
        Checkpoint.model_validate({"storage": {"volume": claim}}).volume_source
        == Checkpoint.model_validate({"volume": claim}).volume_source
    )
    assert Checkpoint.model_validate({"storage": {"s3": S3}}).volume_source is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("bucket", "ab"),
        ("bucket", "a..b"),
        ("bucket", "-ab"),
        ("bucket", "A-bucket"),
        ("bucket", "192.168.1.1"),  # S3 forbids a name formatted as an IP address
        ("bucket", "10.0.0.255"),
        ("prefix", "/abs"),
        ("prefix", "a/../b"),
        ("prefix", "a/"),
        ("endpoint", "s3.example.com"),
        ("endpoint", "http://x:99999999"),  # no such port
        ("endpoint", "http://x:65536"),
        ("endpoint", "http://x:0"),
        ("endpoint", "http://x:09000"),
        ("endpoint", "http://x:"),
        ("endpoint", "http://x:9000:9001"),
        ("endpoint", "http://[::1"),
        ("credentialsSecret", "Not_A_Name"),
        ("sse", "rot13"),
    ],
)
def test_bad_values_name_their_field(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        S3Storage.model_validate({**S3, field: value})
    assert caught.value.errors()[0]["loc"] == (field,)


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://s3.eu-west-1.amazonaws.com",
        "http://minio.storage:9000",
        "http://10.0.0.7:1",
        "http://x:65535/s3/",
        "http://[::1]:9000",
        "http://[fd00::7]",
    ],
)
def test_an_endpoint_with_a_port_that_exists_or_none_is_accepted(endpoint: str) -> None:
    assert S3Storage.model_validate({**S3, "endpoint": endpoint}).endpoint == endpoint


@pytest.mark.parametrize("bucket", ["192.168.1.1.backups", "ckpt-10.0.0.1", "10.0.0", "a.1.2.3"])
def test_a_bucket_with_digits_and_dots_that_is_no_ip_address_is_accepted(bucket: str) -> None:
    assert S3Storage.model_validate({**S3, "bucket": bucket}).bucket == bucket


def test_a_bad_port_and_an_ip_address_bucket_are_named_by_mpjob_validate_with_what_is_allowed() -> None:
    s3 = {"bucket": "192.168.1.1", "endpoint": "http://x:99999999"}
    manifest = bad("spec.checkpoint", {"storage": {"s3": s3}})
    problems = {p.field: p.message for p in check_text(yaml.safe_dump(manifest))[1]}
    assert set(problems) == {"spec.checkpoint.storage.s3.bucket", "spec.checkpoint.storage.s3.endpoint"}
    assert "IP address" in problems["spec.checkpoint.storage.s3.bucket"]
    assert "port from 1 to 65535" in problems["spec.checkpoint.storage.s3.endpoint"]
