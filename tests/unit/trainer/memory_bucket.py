"""MemoryBucket: a bucket in a dict, with the checkpoint store's own Bucket surface, so the
bucket store runs in unit tests (tests/integration/storage runs it against a real S3 server);
FolderBucket: the same over a folder, one bucket for the ranks' processes of a test."""

from __future__ import annotations

import os
from collections.abc import Iterator, MutableMapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from mpjob_contract.storage import S3Storage
from mpjob_trainer.checkpoint.bucket import Bucket

#: The bytes one write of a streamed object hands over (s3transfer's parts are larger).
PART = 1 << 20
SETTINGS = S3Storage(bucket="ckpt", prefix="runs", endpoint="http://s3.test:7070")


class MemoryBucket(Bucket):
    """Objects in a dict; what the store deletes is recorded."""

    def __init__(self) -> None:
        super().__init__(SETTINGS, client=None, transfer=None)
        self.objects: dict[str, bytes] = {}
        self.deleted: list[str] = []
        #: When an object was last written, by the bucket's clock (one a test planted: now).
        self.written: dict[str, datetime] = {}

    def probe(self) -> None:
        pass

    def upload(self, key: str, path: Path) -> None:
        self.objects[key] = path.read_bytes()
        self.written[key] = datetime.now(UTC)

    def put(self, key: str, body: bytes) -> None:
        self.objects[key] = body
        self.written[key] = datetime.now(UTC)

    def create(self, key: str, body: bytes) -> bool:
        """A put only where no object is, as a conditional put (If-None-Match) is: through `put`."""
        if key in self.objects:
            return False
        self.put(key, body)
        return True

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        body = self.objects.get(key)
        return body if body is None or max_bytes is None else body[: max_bytes + 1]

    def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        body = self.objects.get(key)
        return None if body is None else body[offset : offset + length]

    def download_into(self, key: str, sink: Any) -> bool:
        body = self.objects.get(key)
        if body is None:
            return False
        for start in range(0, len(body), PART):
            sink.write(body[start : start + PART])
        return True

    def folders(self, prefix: str, limit: int) -> list[str]:
        below = [key[len(prefix) + 1 :] for key in self.objects if key.startswith(f"{prefix}/")]
        return sorted({rest.split("/")[0] for rest in below if "/" in rest})[:limit]

    def sizes(self, prefix: str, limit: int) -> dict[str, int]:
        below = sorted(
            (key[len(prefix) + 1 :], len(body)) for key, body in self.objects.items() if key.startswith(f"{prefix}/")
        )
        return dict(below[:limit])

    def ages(self, prefix: str, limit: int) -> dict[str, datetime]:
        names = list(self.sizes(prefix, limit))
        return {name: self.written.get(f"{prefix}/{name}", datetime.now(UTC)) for name in names}

    def delete(self, keys: list[str]) -> None:
        self.deleted += keys
        for key in keys:
            self.objects.pop(key, None)

    def abort_uploads(self, prefix: str) -> int:
        return 0


class _Objects(MutableMapping[str, bytes]):
    """A dict of objects kept as files of one folder (a key quoted into one file name)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def __getitem__(self, key: str) -> bytes:
        try:
            return (self.folder / quote(key, safe="")).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None

    def __setitem__(self, key: str, body: bytes) -> None:
        part = self.folder / f".part-{os.getpid()}"
        part.write_bytes(body)
        part.replace(self.folder / quote(key, safe=""))  # whole, as an object lands

    def __delitem__(self, key: str) -> None:
        try:
            (self.folder / quote(key, safe="")).unlink()
        except FileNotFoundError:
            raise KeyError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(unquote(p.name) for p in self.folder.iterdir() if not p.name.startswith(".part-")))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class FolderBucket(MemoryBucket):
    """A MemoryBucket whose objects are files of `folder`: every process that opens it sees one bucket."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.objects = _Objects(folder)  # type: ignore[assignment]
