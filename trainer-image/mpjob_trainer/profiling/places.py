"""Where an attempt's profiles go: the job's own checkpoint store, as its checkpoints do.

A profile is written into a local folder first (`folder`) and then made visible where the job
keeps its checkpoints (`publish`; `where` names its trace there): on a volume the local folder is
already its place below the job's checkpoint folder; for a job whose checkpoints are in a bucket
it is a private spool folder on the pod's scratch disk (mpjob_trainer.spool), and the trace and
its summary are uploaded to `<checkpointDir>/profiles/p<ID>/` in the bucket (the pod's disk is
lost with the pod).
`drop` removes one the attempt wrote (its older traces are pruned).
"""

from __future__ import annotations

import posixpath
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.storage import is_bucket_url, split_url
from mpjob_contract.tracking import SUMMARY_FILE, TRACE_FILE, profile_dir
from mpjob_trainer.checkpoint.bucket import Bucket, open_bucket
from mpjob_trainer.spool import Spool


class ProfilePlace(Protocol):
    def folder(self, profile_id: int) -> Path:
        """The local folder profile `profile_id` is written into."""
        ...

    def where(self, profile_id: int) -> str:
        """Where profile `profile_id`'s trace is once published (the path the status records)."""
        ...

    def publish(self, profile_id: int) -> None:
        """Make the written profile visible in the job's store."""
        ...

    def drop(self, profile_id: int) -> None:
        """Remove a profile this attempt wrote."""
        ...


class FolderProfiles:
    """Profiles in the job's checkpoint folder of the volume."""

    def __init__(self, checkpoint_dir: str) -> None:
        self.checkpoint_dir = checkpoint_dir

    def folder(self, profile_id: int) -> Path:
        return Path(profile_dir(self.checkpoint_dir, profile_id))

    def where(self, profile_id: int) -> str:
        return str(self.folder(profile_id) / TRACE_FILE)

    def publish(self, profile_id: int) -> None:
        """Nothing to do: the folder is its place."""

    def drop(self, profile_id: int) -> None:
        shutil.rmtree(self.folder(profile_id), ignore_errors=True)


class BucketProfiles:
    """Profiles in the job's folder of the checkpoint bucket, spooled locally first; the bucket
    is opened when the first profile is published (`open`: the checkpoint store's settings)."""

    def __init__(self, checkpoint_dir: str, open: Callable[[], Bucket]) -> None:
        self.checkpoint_dir, self._open = checkpoint_dir.rstrip("/"), open
        self._bucket: Bucket | None = None
        self._spool = Spool("mpjob-profiles-")  # on the pod's scratch disk (mpjob_trainer.spool)
        self.spool = self._spool.path

    def folder(self, profile_id: int) -> Path:
        return self.spool / f"p{profile_id}"

    def _keys(self, profile_id: int) -> dict[str, str]:
        _, key = split_url(profile_dir(self.checkpoint_dir, profile_id))
        return {name: posixpath.join(key, name) for name in (TRACE_FILE, SUMMARY_FILE)}

    def bucket(self) -> Bucket:
        if self._bucket is None:
            self._bucket = self._open()
        return self._bucket

    def where(self, profile_id: int) -> str:
        return posixpath.join(profile_dir(self.checkpoint_dir, profile_id), TRACE_FILE)

    def publish(self, profile_id: int) -> None:
        """Upload the summary first, the trace last (a reader sees the trace only when whole)."""
        folder = self.folder(profile_id)
        try:
            for name, key in reversed(self._keys(profile_id).items()):
                self.bucket().upload(key, folder / name)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def drop(self, profile_id: int) -> None:
        self.bucket().delete(list(self._keys(profile_id).values()))


def place_of(launch: AttemptLaunch) -> ProfilePlace:
    """Where `launch`'s attempt keeps its profiles: beside its checkpoints."""
    settings = launch.spec.checkpoint.s3
    if is_bucket_url(launch.checkpoint_dir) and settings is not None:
        return BucketProfiles(launch.checkpoint_dir, lambda: open_bucket(settings))
    return FolderProfiles(launch.checkpoint_dir)
