"""Bucket: the few S3 operations the checkpoint store needs, and which failures are whose.

boto3 (the trainer's `[s3]` extra) because its s3transfer TransferManager is the one piece that
already does what a checkpoint upload needs: multipart above a threshold, a bounded pool of part
uploads, ranged parallel downloads, and botocore's `standard` retry mode (exponential backoff
with jitter on throttling, 5xx and connection errors) under every call. s3fs/fsspec adds an
asyncio layer over the same botocore; s3torchconnector's writer streams one object per call
and its client ships as a native extension: neither buys more for a few large files.

Failures are sorted once, here: what no retry can fix (403, a wrong or unknown key, no such
bucket) is a BucketMisconfigured, a ConfigError that names the bucket, so the attempt ends with
the configuration-error exit code instead of being retried; a missing object is None (the
store decides what that means); anything else has already been retried by botocore.
Credentials come from boto3's own chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (the job's
Secret, as the operator wires it), AWS_SHARED_CREDENTIALS_FILE (a mounted file), or the pod's
workload identity. Nothing here logs a credential.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from mpjob_contract.storage import S3Storage
from mpjob_trainer.errors import ConfigError

#: Error codes no retry can fix: the job's storage settings or credentials are wrong.
PERMANENT = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "NoSuchBucket",
        "InvalidBucketName",
        "AuthorizationHeaderMalformed",
        "403",
        "404",
    }
)
MISSING = frozenset({"NoSuchKey", "404", "NotFound"})
#: A ranged GET's answer when the object ends before the range starts (416): shorter than asked.
PAST_THE_END = frozenset({"InvalidRange", "416"})
#: A download's answer when a later part no longer matches its first (If-Match): the object changed.
CHANGED = frozenset({"PreconditionFailed", "412"})
#: A conditional put's answers when the key holds an object (or another conditional put of it raced).
TAKEN = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
#: A server that does not implement a put's condition.
UNCONDITIONAL = frozenset({"NotImplemented", "501"})
#: Parts of at least 16 MiB above 16 MiB, four in flight: a 200 MiB checkpoint goes up in 13
#: parts using at most 64 MiB of buffers, and a slow part never holds back the others.
MULTIPART_BYTES = 16 << 20
CONCURRENCY = 4
#: Entries one listing request asks for (S3's own maximum).
LIST_PAGE = 1000
#: The unfinished multipart uploads one call aborts (ten listing pages): a backlog past it waits
#: for the next attempt's start.
MAX_UPLOADS = 10 * LIST_PAGE
#: botocore's standard retry mode: this many tries in all, backoff with jitter between them.
MAX_ATTEMPTS = 8


class BucketMisconfigured(ConfigError):
    """The bucket refused us for a reason no retry can fix (names the bucket and the code)."""


class ObjectChanged(Exception):
    """An object was replaced while it was downloaded in parts (names its key)."""


class BucketFailed(Exception):
    """The bucket answered with an error a later retry may fix (a 500, a 503: botocore's own
    retries spent); names the bucket, what was being done (the key) and the server's code."""


@dataclass
class Bucket:
    settings: S3Storage
    client: Any
    transfer: Any

    @property
    def name(self) -> str:
        return self.settings.bucket

    def refused(self, exc: Exception, doing: str) -> Exception:
        """`exc` as the store should see it: BucketMisconfigured when permanent, BucketFailed when
        the server answered with another error code, else (no answer: a connection error, or what
        a download's sink raised) itself."""
        code = _code(exc)
        if code in PERMANENT:
            return BucketMisconfigured(
                f"checkpoint bucket {self.name!r} at {self.settings.endpoint} refused to {doing}: {code} "
                f"({_message(exc)}); check checkpoint.storage.s3 and its credentials"
            )
        if code:
            where = f"checkpoint bucket {self.name!r} at {self.settings.endpoint}"
            return BucketFailed(f"{where} failed to {doing}: {code} ({_message(exc)})")
        return exc

    def probe(self) -> None:
        """Fail now, naming the bucket, when it is missing or the credentials are wrong."""
        try:
            self.client.head_bucket(Bucket=self.name)
        except Exception as exc:
            raise self.refused(exc, "be reached") from exc

    def upload(self, key: str, path: Path) -> None:
        """Put the file at `path` as `key` (multipart when large; parts in parallel)."""
        try:
            self.client.upload_file(str(path), self.name, key, ExtraArgs=self._extra(), Config=self.transfer)
        except Exception as exc:
            raise self.refused(exc, f"store {key}") from exc

    def put(self, key: str, body: bytes) -> None:
        try:
            self.client.put_object(Bucket=self.name, Key=key, Body=body, **self._extra())
        except Exception as exc:
            raise self.refused(exc, f"store {key}") from exc

    def create(self, key: str, body: bytes) -> bool | None:
        """Put `body` as `key` only where no object is (a conditional put: If-None-Match); False when
        one is there (412), or another conditional put of the key raced this one (409); None when the
        server does not implement the condition (501). One that ignores it: checkpoint.put_if_absent."""
        try:
            self.client.put_object(Bucket=self.name, Key=key, Body=body, IfNoneMatch="*", **self._extra())
        except Exception as exc:
            code = _code(exc)
            if code in TAKEN:
                return False
            if code in UNCONDITIONAL:
                return None
            raise self.refused(exc, f"store {key}") from exc
        return True

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        """The object's bytes (with `max_bytes`, no more than one byte past it: the caller sees
        that it is longer); None when there is no such object."""
        try:
            body = self.client.get_object(Bucket=self.name, Key=key)["Body"]
            return bytes(body.read() if max_bytes is None else body.read(max_bytes + 1))
        except Exception as exc:
            if _code(exc) == "NoSuchKey":
                return None
            raise self.refused(exc, f"read {key}") from exc

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """`length` bytes of the object from `offset` (a ranged GET), fewer where it ends sooner; None
        when there is no such object, or it ends before `offset` (the bucket answers 416)."""
        try:
            body = self.client.get_object(Bucket=self.name, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
            return bytes(body["Body"].read(length + 1))
        except Exception as exc:
            if _code(exc) in MISSING | PAST_THE_END:
                return None
            raise self.refused(exc, f"read {key}") from exc

    def download_into(self, key: str, sink: Any) -> bool:
        """Fetch `key` into `sink`, a writable file object that is not seekable: s3transfer hands it
        the bytes in order (ranged parts in parallel, each retried; a part retried midway is not
        written twice). False when there is no such object; ObjectChanged when it was replaced after its
        first part was read (the bucket refuses the later ones); what `sink` raises is raised as it is."""
        try:
            self.client.download_fileobj(self.name, key, sink, Config=self.transfer)
            return True
        except Exception as exc:
            code = _code(exc)
            if code in MISSING:
                return False
            if code in CHANGED:
                raise ObjectChanged(f"{key} changed in the bucket while it was read") from exc
            refusal = self.refused(exc, f"read {key}")
            if refusal is exc:
                raise
            raise refusal from exc

    def folders(self, prefix: str, limit: int) -> list[str]:
        """The names of the folders directly below `prefix/` (S3 common prefixes), in key
        order, no more than `limit` of them: LIST_PAGE a request, the listing stops there."""
        return [p["Prefix"][len(prefix) + 1 :].rstrip("/") for p in self._list(prefix, limit, "CommonPrefixes")]

    def sizes(self, prefix: str, limit: int) -> dict[str, int]:
        """The objects below `prefix/` by their names relative to it, with their sizes, no more
        than `limit` of them (a bounded listing, as `folders`)."""
        return {o["Key"][len(prefix) + 1 :]: int(o["Size"]) for o in self._list(prefix, limit, "Contents")}

    def ages(self, prefix: str, limit: int) -> dict[str, datetime]:
        """The objects below `prefix/` by their names relative to it, with when each was last written
        (the bucket's own clock), no more than `limit` of them (a bounded listing, as `sizes`)."""
        return {o["Key"][len(prefix) + 1 :]: o["LastModified"] for o in self._list(prefix, limit, "Contents")}

    def _list(self, prefix: str, limit: int, field: str) -> list[dict[str, Any]]:
        """Up to `limit` entries of `field` from a paged listing below `prefix/`, in at most
        ceil(limit / LIST_PAGE) requests (whatever else the pages hold)."""
        found: list[dict[str, Any]] = []
        extra: dict[str, str] = {"Delimiter": "/"} if field == "CommonPrefixes" else {}
        try:
            for _ in range(-(-limit // LIST_PAGE)):
                page = self.client.list_objects_v2(Bucket=self.name, Prefix=f"{prefix}/", MaxKeys=LIST_PAGE, **extra)
                found += page.get(field, [])
                if len(found) >= limit or not page.get("IsTruncated") or not page.get("NextContinuationToken"):
                    break
                extra = {**extra, "ContinuationToken": page["NextContinuationToken"]}
        except Exception as exc:
            raise self.refused(exc, f"list {prefix}/") from exc
        return found[:limit]

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            try:
                self.client.delete_object(Bucket=self.name, Key=key)
            except Exception as exc:
                raise self.refused(exc, f"delete {key}") from exc

    def abort_uploads(self, prefix: str) -> int:
        """Abort unfinished multipart uploads below `prefix/` (killed saves'), a listing page at a time,
        no more than MAX_UPLOADS; how many. Each page is listed from the start once the one before it
        is aborted, with no marker: S3-compatible servers (versitygw) refuse the one S3 gives."""
        aborted = 0
        try:
            for _ in range(MAX_UPLOADS // LIST_PAGE):
                page = self.client.list_multipart_uploads(Bucket=self.name, Prefix=f"{prefix}/", MaxUploads=LIST_PAGE)
                found = page.get("Uploads", [])
                for upload in found:
                    self.client.abort_multipart_upload(Bucket=self.name, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += len(found)
                if not found or not page.get("IsTruncated"):
                    break
        except Exception as exc:
            raise self.refused(exc, f"list uploads below {prefix}/") from exc
        return aborted

    def _extra(self) -> dict[str, str]:
        return {"ServerSideEncryption": self.settings.sse} if self.settings.sse else {}


def open_bucket(settings: S3Storage) -> Bucket:
    """A client for `settings`' bucket (retries with backoff, path-style addressing for
    S3-compatible servers), probed: a wrong bucket or credential fails here, named."""
    try:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
    except ImportError as exc:  # an image built without the [s3] extra
        raise ConfigError(
            "checkpoint.storage.s3 needs the trainer's [s3] extra (boto3): pip install 'mpjob-trainer[s3]'"
        ) from exc
    config = Config(
        region_name=settings.region,
        retries={"mode": "standard", "max_attempts": MAX_ATTEMPTS},
        connect_timeout=10,
        read_timeout=60,
        s3={"addressing_style": "path"},
        max_pool_connections=CONCURRENCY * 2,
        # Checksum trailers only where the API requires them: botocore adds CRC32 trailers by
        # default since 1.36, which several S3-compatible servers refuse; every file's sha256
        # is in the manifest and verified on restore anyway.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    client = boto3.session.Session().client("s3", endpoint_url=settings.endpoint, config=config)
    transfer = TransferConfig(
        multipart_threshold=MULTIPART_BYTES, multipart_chunksize=MULTIPART_BYTES, max_concurrency=CONCURRENCY
    )
    bucket = Bucket(settings, client, transfer)
    bucket.probe()
    return bucket


def _answer(exc: Exception) -> dict[str, Any] | None:
    """The server's answer `exc` carries (None: no answer). boto3's upload_file raises
    S3UploadFailedError, which carries none, while handling the ClientError that does: that one's
    (as s3transfer's S3DownloadFailedError, for a part the bucket refused: an object changed)."""
    answered: BaseException | None = exc
    if type(exc).__name__ in ("S3UploadFailedError", "S3DownloadFailedError"):
        answered = exc.__context__
    response = getattr(answered, "response", None)
    return response if isinstance(response, dict) else None


def _code(exc: Exception) -> str:
    response = _answer(exc)
    if response is not None:
        return str(response.get("Error", {}).get("Code", ""))
    if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
        return "InvalidAccessKeyId"
    return ""


def _message(exc: Exception) -> str:
    response = _answer(exc)
    if response is not None:
        return str(response.get("Error", {}).get("Message", "")) or str(exc)
    return str(exc)
