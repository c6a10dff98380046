"""checkpoint.storage: where a job's checkpoints live, one rule for both the operator and the
local runner (the same per-job folder below a volume's mount or a bucket's prefix)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mpjob_contract.api import Checkpoint
from mpjob_contract.launch import CHECKPOINT_MOUNT, checkpoint_root, inside_checkpoint_dir, job_checkpoint_dir
from mpjob_contract.storage import S3Storage, is_bucket_url, split_url

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
        ("prefix", "/abs"),
        ("prefix", "a/../b"),
        ("prefix", "a/"),
        ("endpoint", "s3.example.com"),
        ("credentialsSecret", "Not_A_Name"),
        ("sse", "rot13"),
    ],
)
def test_bad_values_name_their_field(field: str, value: str) -> None:
    with pytest.raises(ValidationError) as caught:
        S3Storage.model_validate({**S3, field: value})
    assert caught.value.errors()[0]["loc"] == (field,)
