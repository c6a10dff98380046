"""A bucket job's local spool (its checkpoints', its profiles') lies in the pod's scratch folder
($MPJOB_SCRATCH_DIR), and the spool a killed trainer left there is removed when the next one
starts; a live trainer's is never touched, nor anything the trainer did not make."""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from mpjob_contract.environment import SCRATCH_ENV
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.profiling.places import BucketProfiles
from mpjob_trainer.spool import OWNER
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

CHECKPOINTS, PROFILES = "mpjob-checkpoints-", "mpjob-profiles-"
#: Another trainer process: it makes a spool of the prefix it is given, says where, and lives
#: until its stdin closes (then it ends as a trainer does, its spool removed) or it is killed.
TRAINER = (
    "import sys\nfrom mpjob_trainer.spool import Spool\n"
    "spool = Spool(sys.argv[1])\nprint(spool.path, flush=True)\nsys.stdin.read()\n"
)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(SCRATCH_ENV, str(tmp_path))
    return tmp_path


@pytest.fixture
def trainer(scratch: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Another trainer holding a checkpoint spool in `scratch`, and that spool."""
    proc = subprocess.Popen(
        [sys.executable, "-c", TRAINER, CHECKPOINTS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        yield proc, Path(proc.stdout.readline().strip())
    finally:
        proc.kill()
        proc.wait()


def _store() -> BucketCheckpointStore:
    location, job = f"{SETTINGS.url}/ns/job/uid", "ns/job/uid"
    return BucketCheckpointStore(location, SETTINGS, keep=2, config_digest="d1", job=job, bucket=MemoryBucket())


def test_a_bucket_stores_spool_is_in_the_pods_scratch_folder_and_gone_with_the_store(scratch: Path) -> None:
    store = _store()
    store.write(1, "bf16", {"step": 1, "w": torch.ones(4)})
    assert store.root.parent == scratch
    assert store.root.name.startswith(CHECKPOINTS)
    del store
    gc.collect()
    assert not list(scratch.iterdir())


def test_the_spool_a_killed_trainer_left_is_removed_when_the_next_one_starts(
    scratch: Path, trainer: tuple[subprocess.Popen[str], Path]
) -> None:
    proc, left = trainer
    (left / "step-000000001").mkdir()
    (left / "step-000000001" / "state.pt").write_bytes(b"x" * 1024)
    proc.kill()  # SIGKILL: no finalizer runs, the kernel drops its lock
    proc.wait()
    assert left.is_dir()
    store = _store()
    assert not left.exists()
    assert [p.name for p in scratch.iterdir()] == [store.root.name]


def test_a_live_trainers_spool_is_never_touched(scratch: Path, trainer: tuple[subprocess.Popen[str], Path]) -> None:
    proc, live = trainer
    (live / "state.pt").write_bytes(b"being uploaded")
    store, sibling = _store(), _store()  # two ranks of one pod start beside it
    assert (live / "state.pt").read_bytes() == b"being uploaded"
    assert store.root.is_dir() and sibling.root.is_dir()
    assert proc.stdin is not None
    proc.stdin.close()  # it ends as a trainer does: its spool goes with it
    assert proc.wait() == 0
    assert not live.exists()


def test_only_spools_of_its_own_kind_and_mark_are_removed(scratch: Path) -> None:
    unmarked = scratch / f"{CHECKPOINTS}older"  # no owner mark: being made, or not a spool of ours
    unmarked.mkdir()
    (unmarked / "state.pt").write_bytes(b"kept")
    profiles = scratch / f"{PROFILES}dead"  # another kind's: its own kind sweeps it
    profiles.mkdir()
    (profiles / OWNER).touch()
    other = scratch / "mpjob-checkpoints.txt"
    other.write_text("not a folder")
    _store()
    assert (unmarked / "state.pt").read_bytes() == b"kept"
    assert profiles.is_dir() and other.is_file()
    BucketProfiles(f"{SETTINGS.url}/ns/job/uid", MemoryBucket)
    assert not profiles.exists()


def test_a_bucket_jobs_profiles_spool_in_the_pods_scratch_folder(scratch: Path) -> None:
    place = BucketProfiles(f"{SETTINGS.url}/ns/job/uid", MemoryBucket)
    assert place.folder(1).parent.parent == scratch
    assert place.spool.name.startswith(PROFILES)


def test_without_a_scratch_folder_the_spool_is_in_the_systems_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCRATCH_ENV, raising=False)  # a local run: no pod names one
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert _store().root.parent == tmp_path
