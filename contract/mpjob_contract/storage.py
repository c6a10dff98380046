"""Where a job's checkpoints live: a volume (api.CheckpointVolume) or an S3-compatible bucket.

`checkpoint.storage.s3` names a bucket, a key prefix, the endpoint and region, the Secret that
holds the credentials (by name: the operator never reads it; trainer pods get its keys as
environment) and optional server-side encryption. A checkpoint's objects lie under
`s3://<bucket>/<prefix>/<namespace>/<job>/<uid>/step-N/`: the same per-job folder rule as on a
volume (launch.job_checkpoint_dir), with `s3://<bucket>/<prefix>` as the root.

Single-field rules (the bucket's name, the endpoint's form and port) sit on the fields, where the
JSON schema carries them to the API server; the cross-field ones, and the bucket's "not an IP
address" (a pattern cannot say "not"; CEL on the field does), are in mpjob_contract.rules.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from mpjob_contract import formats, rules

#: The keys the credentials Secret must hold; trainer pods get them as these variables, the
#: names every S3 client reads.
ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
CREDENTIAL_KEYS = (ACCESS_KEY_ID, SECRET_ACCESS_KEY)
URL_SCHEME = "s3://"

ServerSideEncryption = Literal["AES256", "aws:kms"]


class S3Storage(BaseModel):
    """An S3-compatible bucket (AWS S3, MinIO, Ceph RGW, GCS's XML API, versitygw)."""

    # The API's wire conventions (as api.ApiModel): camelCase, unknown fields refused.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", validate_default=True)

    bucket: str = Field(
        min_length=3, max_length=63, pattern=formats.BUCKET.pattern, description="Bucket name (S3's naming rules)."
    )
    prefix: str = Field(
        "mpjob",
        max_length=512,
        pattern=formats.PREFIX.pattern,
        description="Key prefix; the job's folder goes below it.",
    )
    endpoint: str = Field(
        max_length=2048,
        pattern=formats.ENDPOINT.pattern,
        description="The S3 API's URL, e.g. https://s3.eu-west-1.amazonaws.com or http://minio.storage:9000.",
    )
    region: str = Field(
        "us-east-1",
        min_length=1,
        max_length=64,
        pattern=formats.REGION.pattern,
        description=f"The bucket's region, signed into requests: {formats.REGION.allows}.",
    )
    credentials_secret: str | None = Field(
        None,
        max_length=253,
        pattern=formats.SECRET_NAME.pattern,
        description=f"Secret in the job's namespace with keys {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY}, "
        "given to trainer pods as environment (the operator never reads it). Unset: the pods' own "
        "credentials (workload identity).",
    )
    sse: ServerSideEncryption | None = Field(None, description="Server-side encryption of every object written.")

    @field_validator("bucket")
    @classmethod
    def _not_an_ip_address(cls, value: str) -> str:
        rules.BUCKET_NOT_AN_IP_ADDRESS.check(value)
        return value

    @property
    def url(self) -> str:
        """The store's root, `s3://<bucket>/<prefix>`: the `root` of launch.job_checkpoint_dir."""
        return f"{URL_SCHEME}{self.bucket}/{self.prefix}"


def is_bucket_url(location: str) -> bool:
    """Whether a checkpoint location (AttemptLaunch.checkpointDir, a ref's path) is in a bucket."""
    return location.startswith(URL_SCHEME)


def split_url(location: str) -> tuple[str, str]:
    """`s3://bucket/key/prefix` -> (bucket, key prefix without a trailing `/`)."""
    if not is_bucket_url(location):
        raise ValueError(f"{location!r} is not an {URL_SCHEME} location")
    bucket, _, key = location[len(URL_SCHEME) :].partition("/")
    return bucket, key.strip("/")
