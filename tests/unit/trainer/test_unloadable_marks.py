"""checkpoint.unloadable over both stores (a folder, a bucket): a checkpoint that verifies and
did not load is marked beside it, so a later process (a fresh store) passes it over on resume
and replaces it when it saves its step; a mark counts only while it names the sha256 of the
checkpoint now at its step and this trainer's build (its releases and image:
test_unloadable_image), read no further than MARK_BYTES."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_trainer.checkpoint import resume, unloadable
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.resume import Loaded
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.checkpoint.unloadable import MARK_BYTES
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

JOB = "ns/job/uid"
#: The build of another trainer image (one whose restore had a bug, say).
OTHER_BUILD = "mpjob-trainer 0.0.9 torch 2.5.0 image 0123456789abcdef"
Opens = Callable[[list[dict[str, Any]]], AnyStore]


@pytest.fixture(params=["volume", "bucket"])
def opens(request: pytest.FixtureRequest, tmp_path: Path) -> Opens:
    """Opens a store of one place afresh, as a later process does, logging into the list given."""
    from mpjob_trainer.checkpoint import CheckpointStore

    bucket = MemoryBucket()

    def open_(log: list[dict[str, Any]]) -> AnyStore:
        def record(event: str, **fields: Any) -> None:
            log.append({"event": event, **fields})

        if request.param == "volume":
            return CheckpointStore(tmp_path, keep=5, config_digest="d1", log=record, job=JOB)
        location = f"{SETTINGS.url}/ns/job/uid"
        return BucketCheckpointStore(location, SETTINGS, keep=5, config_digest="d1", job=JOB, log=record, bucket=bucket)

    return open_


def _save(store: AnyStore, step: int, value: float | None = None) -> str:
    """`step`'s checkpoint written; its state sha256."""
    w = torch.full((4,), float(step if value is None else value))
    return store.write(step, "bf16", {"step": step, "w": w}).ref.sha256


def _restore(tried: list[int], bad: int | None = None) -> resume.Restore:
    def restore(loaded: Loaded) -> None:
        tried.append(loaded[0].step)
        if loaded[0].step == bad:
            raise CorruptCheckpoint(f"step {bad}: its state does not load")

    return restore


def _found_unloadable(opens: Opens) -> str:
    """Checkpoints of 10 and 20 of which 20 does not load, found so by a first process; 20's sha256."""
    first = opens([])
    _save(first, 10)
    sha256 = _save(first, 20)
    loaded = resume.load(first, restore=_restore([], bad=20))
    assert loaded is not None and loaded[0].step == 10
    return sha256


def test_a_later_process_passes_the_checkpoint_over_without_loading_it(opens: Opens) -> None:
    _found_unloadable(opens)
    tried: list[int] = []
    log: list[dict[str, Any]] = []
    loaded = resume.load(opens(log), restore=_restore(tried))
    assert loaded is not None and loaded[0].step == 10 and tried == [10]
    assert [e["event"] for e in log] == ["checkpointRejected"]
    assert "did not load in an earlier try" in log[0]["problem"]


def test_a_later_process_saving_its_step_sets_it_aside_and_writes_its_own(opens: Opens) -> None:
    unloadable = _found_unloadable(opens)
    later = opens([])
    saved = _save(later, 20, value=-20.0)
    assert saved != unloadable
    where = dict(later.steps())[20]
    assert later.verify(where)[0].sha256 == saved and len(later.aside()) == 1  # the old one kept for diagnosis
    assert later.unloadable_mark(where) is None  # the mark went with it
    loaded = resume.load(opens([]), restore=_restore([]))
    assert loaded is not None and loaded[0].step == 20 and torch.equal(loaded[1]["w"], torch.full((4,), -20.0))


@pytest.mark.parametrize(
    "mark",
    [
        "{zeros} {build}\n",
        "{sha} {other}\n",
        "{sha}",
        "{sha}\n",
        "{sha} {releases}\n",
        "not a sha256",
        "{sha} {build}",
        "{sha} {build}\n" + "x" * MARK_BYTES,
        "\xff" * (MARK_BYTES * 8),
    ],
    ids=[
        "another-checkpoints",
        "another-build",
        "old-format",
        "old-format-line",
        "format-without-image",
        "no-sha256",
        "no-line-end",
        "mark-then-more",
        "binary",
    ],
)
def test_a_mark_that_does_not_name_the_checkpoint_at_its_step_counts_for_nothing(opens: Opens, mark: str) -> None:
    store = opens([])
    _save(store, 10)
    sha256 = _save(store, 20)
    where = dict(store.steps())[20]
    releases = store.build.rsplit(" image ", 1)[0]  # the build as marks named it before they held the image
    said = mark.format(zeros="0" * 64, sha=sha256, build=store.build, other=OTHER_BUILD, releases=releases)
    store.mark_unloadable(where, said)
    later = opens([])
    assert _save(later, 20, value=-20.0) == sha256 and later.aside() == []  # kept: never overwritten
    tried: list[int] = []
    loaded = resume.load(opens([]), restore=_restore(tried))
    assert loaded is not None and loaded[0].step == 20 and tried == [20]


def test_a_checkpoint_another_build_marked_is_tried_again_and_loads(opens: Opens) -> None:
    """A restore bug of one image marked a good checkpoint: the image that fixes it loads it."""
    sha256 = _found_unloadable(opens)
    store = opens([])
    where = dict(store.steps())[20]
    store.mark_unloadable(where, unloadable.text(sha256, OTHER_BUILD))
    tried: list[int] = []
    log: list[dict[str, Any]] = []
    loaded = resume.load(opens(log), restore=_restore(tried))
    assert loaded is not None and loaded[0].step == 20 and tried == [20] and log == []


def test_a_checkpoint_another_build_marked_that_still_does_not_load_is_marked_for_this_build(opens: Opens) -> None:
    sha256 = _found_unloadable(opens)
    store = opens([])
    where = dict(store.steps())[20]
    store.mark_unloadable(where, unloadable.text(sha256, OTHER_BUILD))
    tried: list[int] = []
    loaded = resume.load(opens([]), restore=_restore(tried, bad=20))
    assert loaded is not None and loaded[0].step == 10 and tried == [20, 10]
    assert store.unloadable_mark(where) == f"{sha256} {store.build}\n".encode()
    again: list[int] = []
    loaded = resume.load(opens([]), restore=_restore(again, bad=20))
    assert loaded is not None and loaded[0].step == 10 and again == [10]  # passed over, not tried


def test_the_build_a_mark_names_is_this_trainers_releases_and_its_image() -> None:
    build = unloadable.build("registry.example/train:1")
    assert build.startswith("mpjob-trainer ") and f" torch {torch.__version__} image " in build
    assert len(unloadable.text("0" * 64, build)) <= MARK_BYTES
