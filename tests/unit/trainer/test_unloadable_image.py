"""The build a mark of checkpoint.unloadable names holds the job's image: a restore that failed for
the user's code (their task.module, their objects through the SDK, a model class) is fixed in a
new image of the same mpjob-trainer and torch, and that image tries the marked checkpoint again;
the image that marked it still passes it over."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from mpjob_contract.launch import AttemptLaunch
from mpjob_contract.tracking import IMAGE_ENV
from mpjob_trainer.checkpoint import resume, unloadable
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.resume import Loaded
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore, open_store
from mpjob_trainer.checkpoint.unloadable import MARK_BYTES
from tests.unit.trainer.conftest import spec
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket

pytestmark = pytest.mark.unit

#: The user's image whose model class could not load step 20's state, and the one that fixes it.
BROKEN, FIXED = "registry.example/team/train:1.4", "registry.example/team/train:1.5"
Opens = Callable[[str | None], AnyStore]


def _launch(tmp_path: Path, image: str | None) -> AttemptLaunch:
    job = spec(**({"image": image} if image else {}))
    return AttemptLaunch.model_validate(
        {"jobName": "t", "precision": "fp32", "checkpointDir": str(tmp_path / "ckpt"), "spec": job}
    )


@pytest.fixture(params=["volume", "bucket"])
def opens(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Opens:
    """Opens the attempt's store afresh, as a later process of a job in image `image` does."""
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    bucket = MemoryBucket()

    def open_(image: str | None) -> AnyStore:
        launch = _launch(tmp_path, image)
        if request.param == "volume":
            return open_store(launch, config_digest="d1", log=lambda *a, **k: None)
        build = unloadable.launched(launch)  # as open_store gives it (its bucket is a real server's)
        url = f"{SETTINGS.url}/ns/t/uid"
        return BucketCheckpointStore(
            url, SETTINGS, keep=5, config_digest="d1", job="ns/t/uid", bucket=bucket, build=build
        )

    return open_


def _resumes(store: AnyStore, bad: int | None = None) -> tuple[int, list[int]]:
    """The step `store` resumes from, and the steps it tried to load (`bad` does not load)."""
    tried: list[int] = []

    def restore(loaded: Loaded) -> None:
        tried.append(loaded[0].step)
        if loaded[0].step == bad:
            raise CorruptCheckpoint(f"step {bad}: the model class does not take its state")

    loaded = resume.load(store, restore=restore)
    assert loaded is not None
    return loaded[0].step, tried


def _marked_by_broken_image(opens: Opens) -> None:
    """Checkpoints of 10 and 20 written; the BROKEN image could not load 20 and marked it."""
    first = opens(BROKEN)
    for step in (10, 20):
        first.write(step, "fp32", {"step": step, "w": torch.full((4,), float(step))})
    assert _resumes(first, bad=20) == (10, [20, 10])
    where = dict(first.steps())[20]
    assert first.unloadable_mark(where) == unloadable.text(first.verify(where)[0].sha256, first.build).encode()


def test_a_mark_written_in_one_image_counts_for_nothing_in_another(opens: Opens) -> None:
    _marked_by_broken_image(opens)
    assert _resumes(opens(FIXED)) == (20, [20])  # tried again: the fixed image loads it


def test_a_mark_still_counts_in_the_image_that_wrote_it(opens: Opens) -> None:
    _marked_by_broken_image(opens)
    assert _resumes(opens(BROKEN)) == (10, [10])  # passed over, not loaded again


def test_the_image_is_the_specs_else_the_one_the_operator_started(monkeypatch: pytest.MonkeyPatch) -> None:
    at = Path("/ckpt")
    monkeypatch.delenv(IMAGE_ENV, raising=False)
    unknown = unloadable.launched(_launch(at, None))
    assert unknown.endswith(" image -")
    monkeypatch.setenv(IMAGE_ENV, "registry.example/mpjob/trainer:0.9")  # the operator's default image
    default = unloadable.launched(_launch(at, None))
    assert default == unloadable.build("registry.example/mpjob/trainer:0.9") != unknown
    assert unloadable.launched(_launch(at, BROKEN)) == unloadable.build(BROKEN) != unloadable.build(FIXED)


def test_a_mark_stays_one_bounded_line_whatever_the_image_reference() -> None:
    longest = "registry.example/" + "a" * 200 + "@sha256:" + "f" * 64
    mark = unloadable.text("0" * 64, unloadable.build(longest))
    assert mark.endswith("\n") and mark.count("\n") == 1 and len(mark.encode()) <= MARK_BYTES
    assert longest not in mark and len(unloadable.build(longest)) == len(unloadable.build(BROKEN))
