"""A checkpoint manifest's JSON as read: the shape and the bounds every reader relies on.

Whoever can write the checkpoint volume or the bucket can write a manifest, and a restore, a
prune and a save's check of its step all act on what one says: the files to download, hash and
delete. So a manifest is parsed once, here, by one pydantic model (checkpoint.manifest turns it
into a Manifest; the bucket store reads the same): JSON nested past the parser's limit, a field
of the wrong type, a precision the API does not know, a size, a total or a count past its bound, and
above all a file name that could leave the checkpoint's folder (absolute, `..`, a backslash, an
empty segment) all raise `Malformed`, which the readers treat as a corrupt checkpoint: logged,
the previous good one used, nothing of it pruned.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from mpjob_contract.api import Precision

#: The largest manifest read; a 4096-rank sharded checkpoint lists about 8200 files, 1.2 MB.
MAX_MANIFEST_BYTES = 16 << 20
#: Files one checkpoint may list (two per rank and DCP's index for a sharded one).
MAX_FILES = 65_536
#: The largest size a manifest may give one file (16 TiB).
MAX_FILE_BYTES = 1 << 44
#: The most all files of one checkpoint may add up to (64 TiB), checked before any is read.
MAX_CHECKPOINT_BYTES = 1 << 46
#: A file's name: at most this many characters, each segment at most MAX_SEGMENT_BYTES in UTF-8:
#: what a file's name may have on a filesystem (NAME_MAX), where a restore writes or reads it.
MAX_NAME_CHARS = 1024
MAX_SEGMENT_BYTES = 255
#: A step's folder name has nine digits (checkpoint.manifest.folder_name).
MAX_STEP = 10**9 - 1
MAX_WORLD_SIZE = 1 << 20
#: A bucket writer's folder below the step's prefix (checkpoint.objects): one plain segment.
WRITER = r"^w-[0-9a-f]{12}$"

Short = Annotated[str, Field(max_length=MAX_NAME_CHARS)]


class Malformed(ValueError):
    """A manifest that is not one: says what is wrong with it."""


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    bytes: int = Field(ge=0, le=MAX_FILE_BYTES)


class ManifestDocument(BaseModel):
    """manifest.json, as checkpoint.manifest.Manifest.to_json writes it (createdAt is not read)."""

    #: strict: a number is a JSON number, never a string or a boolean that would coerce to one.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, strict=True)

    format_version: int = Field(1, alias="formatVersion")
    step: int = Field(ge=0, le=MAX_STEP)
    precision: Precision
    config_digest: Short | None = Field(None, alias="configDigest")
    job: Short = ""
    layout: Annotated[str, Field(max_length=32)] = "single"
    world_size: int = Field(1, alias="worldSize", ge=1, le=MAX_WORLD_SIZE)
    files: dict[str, FileEntry] = Field(max_length=MAX_FILES)
    writer: str | None = Field(None, pattern=WRITER)
    attempt: int | None = Field(None, ge=0, le=MAX_STEP)
    attempt_job: Short | None = Field(None, alias="attemptJob")

    @field_validator("files")
    @classmethod
    def _names_stay_inside(cls, files: dict[str, FileEntry]) -> dict[str, FileEntry]:
        folders: set[str] = set()
        for name in files:
            problem = name_problem(name)
            if problem:
                raise ValueError(f"file name {name[:100]!r}: {problem}")
            parts = name.split("/")
            folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        clash = sorted(folders & files.keys())
        if clash:
            raise ValueError(f"file name {clash[0][:100]!r} is also the folder of another file")
        if sum(entry.bytes for entry in files.values()) > MAX_CHECKPOINT_BYTES:
            raise ValueError(f"files add up to more than the {MAX_CHECKPOINT_BYTES} bytes a checkpoint may have")
        return files


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a file of a checkpoint's folder (None: it can): relative POSIX
    segments only, so `folder / name` never leaves the folder, each one a name a filesystem holds
    (a bucket's key may hold longer ones: downloaded, they could not be written)."""
    if not name or len(name) > MAX_NAME_CHARS:
        return f"must have 1 to {MAX_NAME_CHARS} characters"
    if "\\" in name or any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds a backslash or a control character"
    if name.startswith("/"):
        return "is absolute"
    for segment in name.split("/"):
        if segment in ("", ".", ".."):
            return "has an empty, '.' or '..' segment"
        if len(segment.encode("utf-8", "surrogatepass")) > MAX_SEGMENT_BYTES:  # 255 characters may be 1020 bytes
            return f"has a segment longer than {MAX_SEGMENT_BYTES} bytes"
    return None


def parse(raw: bytes) -> ManifestDocument:
    """The manifest in `raw`; Malformed, saying why, when it is not a valid one."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise Malformed(f"{len(raw)} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have")
    try:
        return ManifestDocument.model_validate_json(raw)
    except ValidationError as exc:
        raise Malformed(_summary(exc)) from None
    except (ValueError, RecursionError, MemoryError) as exc:  # the JSON parser's own limits
        raise Malformed(f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _summary(exc: ValidationError) -> str:
    errors = exc.errors(include_url=False, include_input=False)
    found = [f"{'.'.join(str(p) for p in e['loc']) or 'manifest'}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(found) + more
