"""Which checkpoint is good is the run's knowledge, held by the Checkpointer alone (a store only
persists): the checkpoint resumed from, then each save once it is durable and reported; a save
that fails leaves it as it was; a framework's Checkpointer takes over what the loop's knew."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from mpjob_trainer.checkpoint import CheckpointStore, CheckpointTaken
from mpjob_trainer.checkpoint.s3 import BucketCheckpointStore
from mpjob_trainer.checkpoint.select import AnyStore
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from mpjob_trainer.session.framework import FrameworkCheckpointer
from mpjob_trainer.session.state import TrainingState
from tests.unit.trainer.interleaving import Interleaving
from tests.unit.trainer.memory_bucket import SETTINGS, MemoryBucket
from tests.unit.trainer.test_sharding import ranks

pytestmark = pytest.mark.unit

JOB = "ns/j/u1"


class _State:
    """What Checkpointer.open asks of a TrainingState: no sharded model, no optimizer to hook;
    a restore gives the applied-step count."""

    sharded = None

    def optimizers(self) -> list[torch.optim.Optimizer]:
        return []

    def restore(self, state: dict[str, Any], precision: str, scaler: Any) -> int:
        return int(state["step"])


def _places(kind: str, root: Path) -> Callable[[], AnyStore]:
    """Stores of one place (a folder, or a prefix of one in-memory bucket), opened afresh."""
    if kind == "volume":
        return lambda: CheckpointStore(root, keep=5, config_digest="d", job=JOB)
    bucket = MemoryBucket()
    return lambda: BucketCheckpointStore(
        f"{SETTINGS.url}/ns/j/u1", SETTINGS, keep=5, config_digest="d", job=JOB, bucket=bucket
    )


def _checkpointer(store: AnyStore) -> Checkpointer:
    return Checkpointer(store, World(0, 1, 0), EventLog(stream=io.StringIO()), TrainerMetrics("j", "ns", 0, "fp32"))


def _state(step: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"step": step, "w": torch.full((2,), float(step))}


@pytest.mark.parametrize("kind", ["volume", "bucket"])
def test_the_checkpoint_resumed_from_is_the_last_good_one(tmp_path: Path, kind: str) -> None:
    store = _places(kind, tmp_path)
    fresh = _checkpointer(store())
    assert fresh.open(cast(TrainingState, _State()), None, "fp32", None) is None and fresh.last_good is None
    for step in (10, 20):
        store().write(step, "fp32", _state(step)())
    checkpoints = _checkpointer(store())
    opened = checkpoints.open(cast(TrainingState, _State()), None, "fp32", None)
    assert opened is not None and opened[0].step == 20 and opened[1] == 20
    assert checkpoints.last_good == opened[0]


def test_a_save_is_the_last_good_one_once_it_is_durable_and_reported(tmp_path: Path) -> None:
    checkpoints = _checkpointer(CheckpointStore(tmp_path, keep=5, config_digest="d", job=JOB))
    checkpoints.save(10, "fp32", _state(10), final=True)
    assert checkpoints.last_good is not None and checkpoints.last_good.step == 10
    checkpoints.save(20, "fp32", _state(20), final=False)
    checkpoints.collect(block=True, training_step=20)
    assert checkpoints.last_good is not None and checkpoints.last_good.step == 20


def test_a_save_that_fails_leaves_the_last_good_one(tmp_path: Path) -> None:
    CheckpointStore(tmp_path, keep=5, config_digest="d", job="ns/other/u2").write(20, "fp32", _state(20)())
    checkpoints = _checkpointer(CheckpointStore(tmp_path, keep=5, config_digest="d", job=JOB))
    checkpoints.save(10, "fp32", _state(10), final=True)
    with pytest.raises(CheckpointTaken):
        checkpoints.save(20, "fp32", _state(20), final=True)
    checkpoints.save(20, "fp32", _state(20), final=False)
    assert checkpoints.collect(block=True, training_step=20) is None and checkpoints.failures == 2
    assert checkpoints.last_good is not None and checkpoints.last_good.step == 10


def _weights(staging: Path) -> Path:
    """A framework's checkpoint: one file, in the staging folder it is given."""
    (staging / "weights").write_text("20")
    return staging


@pytest.mark.parametrize("kind", ["volume", "bucket"])
def test_a_framework_checkpointer_takes_over_the_last_good_one_and_moves_it_on(tmp_path: Path, kind: str) -> None:
    store = _places(kind, tmp_path)
    base = _checkpointer(store())
    base.save(10, "fp32", _state(10), final=True)
    framework = FrameworkCheckpointer(base, write=_weights, model=torch.nn.Linear(2, 2))
    assert framework.last_good == base.last_good
    framework.save(20, "fp32", _state(20), final=True)
    assert framework.last_good is not None and framework.last_good.step == 20
    resumed = _checkpointer(store())
    opened = resumed.open(cast(TrainingState, _State()), None, "fp32", None)
    assert opened is not None and resumed.last_good == framework.last_good
    assert (resumed.store.framework_folder(opened[0]) / "weights").read_text() == "20"


def test_two_framework_saves_of_one_step_never_write_into_each_others_staging(tmp_path: Path) -> None:
    """An attempt's trainer still saving beside the next one's (one volume, the same step): the
    framework files committed as the first's, and claimed as its last good, are the first's."""
    race = Interleaving(lambda: second.save(20, "fp32", _state(20), final=False))

    def write(name: str) -> Callable[[Path], Path]:
        def into(staging: Path) -> Path:
            (staging / "weights").write_text(name)
            race.pause()  # written: the first lets the second write now, the second waits for the first
            return staging

        return into

    def framework(name: str) -> FrameworkCheckpointer:
        base = _checkpointer(CheckpointStore(tmp_path, keep=5, config_digest="d", job=JOB))
        return FrameworkCheckpointer(base, write=write(name), model=torch.nn.Linear(2, 2))

    first, second = framework("first"), framework("second")
    first.save(20, "fp32", _state(20), final=True)
    race.finish()
    assert first.last_good is not None
    assert (Path(first.last_good.path) / "framework" / "weights").read_text() == "first"
    assert second.last_good == first.last_good  # kept, not overwritten
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.process
@pytest.mark.parametrize("case", ["resume_one_cannot_load", "resume_listed_apart"])
def test_every_rank_resumes_the_same_checkpoint(tmp_path: Path, case: str) -> None:
    """A rank that cannot load the newest checkpoint, or that listed the folder after another
    writer committed a newer one, must not resume elsewhere than the others (DDP ranks at two
    steps, with two states): the ranks take rank 0's candidates, and skip one any rank rejects."""
    assert [(seen["step"], seen["w"]) for seen in ranks(tmp_path, case, 2)] == [(10, 10.0), (10, 10.0)]


@pytest.mark.process
@pytest.mark.parametrize(
    ("case", "ended"),
    [
        ("resume_one_cannot_read", [{"step": None, "w": 0.0}] * 2),
        ("resume_loaded_apart", [{"error": "ResumedApart", "w": 15.0}, {"error": "ResumedApart", "w": 0.0}]),
        ("resume_apart_then_again", [{"step": None, "w": 0.0}] * 2),  # the next attempt: no ResumedApart again
    ],
)
def test_ranks_never_start_fresh_from_two_states(tmp_path: Path, case: str, ended: list[dict[str, Any]]) -> None:
    """The only checkpoint, rejected because one rank cannot read or load it, must not stay
    loaded on the others for a start at step 0 (DDP would train two weights for good): the
    ranks agree on its files before any loads it, and when a rank loaded one the others could
    not, with none left to load on every rank, the attempt ends instead of starting fresh."""
    assert ranks(tmp_path, case, 2) == ended


@pytest.mark.process
def test_a_manifest_one_rank_rejects_is_rejected_by_every_rank(tmp_path: Path) -> None:
    """A rank whose copy of a sharded checkpoint's manifest fails its checks must not leave the
    others alone in the joint check of its files (they would wait for it forever): every rank
    reaches the agreement with its own verdict, and all reject it together."""
    assert ranks(tmp_path, "resume_manifest_rejected_on_one_rank", 2, timeout=60) == [{"step": None}] * 2
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    assert ranks(bucket, "bucket_manifest_missing_on_one_rank", 2, timeout=60) == [{"step": None}] * 2


@pytest.mark.process
def test_a_read_that_fails_on_one_rank_stops_every_rank(tmp_path: Path) -> None:
    """A rank whose read of a checkpoint raises (an I/O or bucket error: no verdict on the
    checkpoint, so not a rejection) must not leave the others alone in the ranks' agreement: it
    raises its error, the others a PeerFailed that names it (the attempt ends InfraError)."""
    failed, raised = ranks(tmp_path, "agreed_read_failing_on_one_rank", 2, timeout=60)
    assert failed["raised"] == "PeerFailed" and "rank 1 failed" in failed["message"], failed
    assert "OSError: [Errno 5] Input/output error" in failed["message"]
    assert raised == {"raised": "OSError", "message": "[Errno 5] Input/output error"}


@pytest.mark.process
def test_a_checkpoint_one_rank_cannot_bring_forward_ends_every_rank_alike(tmp_path: Path) -> None:
    """A rank whose restore raises a ConfigError (an older format it cannot bring forward) must not
    leave the others waiting in the ranks' agreement on the restore: every rank raises it."""
    forward, failed = ranks(tmp_path, "resume_upgrade_fails_on_one_rank", 2, timeout=60)
    assert failed["error"] == "ConfigError" and "checkpoint format 1" in failed["message"], failed
    assert forward["error"] == "ConfigError" and forward["message"].startswith("rank 1: "), forward
    assert "checkpoint format 1" in forward["message"], forward


@pytest.mark.process
def test_a_sharded_checkpoints_own_fields_one_rank_rejects_are_rejected_by_every_rank(tmp_path: Path) -> None:
    """A rank whose own rank file of a sharded checkpoint holds unusable fields must not leave the
    others alone in the joint read of its shards (they would wait for it forever)."""
    assert ranks(tmp_path, "restore_fields_rejected_on_one_rank", 2, timeout=60) == [{"rejected": True}] * 2


@pytest.mark.process
def test_a_checkpoint_one_rank_cannot_load_is_replaced_by_the_saving_rank(tmp_path: Path) -> None:
    """Rank 0 writes the saves: it must know a checkpoint rank 1 could not load is unloadable, or
    its next save of that step would keep the bad checkpoint rather than replace it."""
    expected = [{"unloadable": ["step-000000015"]}] * 2
    assert ranks(tmp_path, "resume_unloadable_on_every_rank", 2, timeout=60) == expected
