"""status.lastCheckpoint is the newest verified checkpoint with its real sha256 while the attempt
runs, not only after it ends: the trainer labels its last-good-checkpoint series with the sha256
and precision of the checkpoint it wrote or resumed from, and the operator's scrape copies them
(checked: 64 hex digits, a known precision) into the status."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client import generate_latest

from mpjob.controller.exposition import parse
from mpjob.controller.progress import figures
from mpjob_contract import metrics as tm
from mpjob_contract.api import MixedPrecisionJobStatus
from mpjob_contract.report import CheckpointRef
from mpjob_trainer.checkpoint import CheckpointStore, resume
from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint
from mpjob_trainer.checkpoint.resume import Loaded
from mpjob_trainer.distributed import World
from mpjob_trainer.events import EventLog
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.checkpointing import Checkpointer
from tests.unit.operator.live_reads import progress_patch

pytestmark = pytest.mark.unit


def running(**fields: Any) -> MixedPrecisionJobStatus:
    return MixedPrecisionJobStatus.model_validate(
        {"phase": "Running", "precision": "fp16", "attempt": 0, "step": 10, **fields}
        | {"attempts": [{"index": 0, "precision": "fp16", "startStep": 0}]}
    )


def _state_at(step: int) -> Callable[[], dict[str, Any]]:
    return lambda: {"step": step, "w": torch.ones(2) * step}


def scraped(metrics: TrainerMetrics) -> dict[str, Any]:
    return figures(parse(generate_latest(metrics.registry).decode()), precision="fp16")


def test_a_checkpoint_written_during_the_run_reaches_the_status_with_its_sha256(tmp_path: Path) -> None:
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    checkpoints = Checkpointer(
        CheckpointStore(tmp_path, keep=3, config_digest="d"), World(0, 1, 0), EventLog(stream=io.StringIO()), metrics
    )
    for step in (10, 20):
        checkpoints.save(step, "fp16", _state_at(step), final=False)
        checkpoints.collect(block=True, training_step=step)
    ref = checkpoints.last_good
    assert ref is not None and ref.step == 20 and len(ref.sha256) == 64
    found = scraped(metrics)
    assert found["lastCheckpoint"] == {"step": 20, "sha256": ref.sha256, "precision": "fp16"}
    patch = progress_patch(running(), found)
    assert patch["lastCheckpoint"] == {"step": 20, "sha256": ref.sha256, "precision": "fp16", "path": ""}
    series = [s for f in metrics.registry.collect() if f.name == tm.LAST_GOOD_CHECKPOINT for s in f.samples]
    assert [s.labels["sha256"] for s in series] == [ref.sha256], "one series: the previous checkpoint's is gone"


def test_the_checkpoint_resumed_from_is_named_with_its_own_precision_and_survives_a_relabel() -> None:
    metrics = TrainerMetrics("j", "ns", 0, "auto")
    metrics.checkpoint_good(CheckpointRef(step=200, path="/c/step-000000200", sha256="a" * 64, precision="fp16"))
    metrics.relabel("bf16")  # an `auto` attempt measured its device
    found = scraped(metrics)
    assert found["lastCheckpoint"] == {"step": 200, "sha256": "a" * 64, "precision": "fp16"}
    series = [s for f in metrics.registry.collect() if f.name == tm.LAST_GOOD_CHECKPOINT for s in f.samples]
    assert [s.labels["precision"] for s in series] == ["bf16"]


def _damaged_at(*steps: int) -> Callable[[Loaded], None]:
    """A restore that finds the checkpoints of `steps` damaged since they were saved."""

    def restore(loaded: Loaded) -> None:
        if loaded[0].step in steps:
            raise CorruptCheckpoint(f"step {loaded[0].step}: damaged since it was saved")

    return restore


def test_going_back_past_a_damaged_checkpoint_names_the_one_taken_while_the_attempt_runs(tmp_path: Path) -> None:
    """A dashboard, or the operator's scrape, must not see a checkpoint the run passed over as
    the last good one until the attempt ends: the series follow what going back settled on."""
    metrics = TrainerMetrics("j", "ns", 0, "fp16")
    checkpoints = Checkpointer(
        CheckpointStore(tmp_path, keep=3, config_digest="d"), World(0, 1, 0), EventLog(stream=io.StringIO()), metrics
    )
    for step in (10, 20):
        checkpoints.save(step, "fp16", _state_at(step), final=True)
    loaded = checkpoints.back_to(20, _damaged_at(20))
    assert loaded is not None and loaded[0].step == 10
    assert scraped(metrics)["lastCheckpoint"] == {"step": 10, "sha256": loaded[0].sha256, "precision": "fp16"}
    series = [s for f in metrics.registry.collect() if f.name == tm.LAST_GOOD_CHECKPOINT for s in f.samples]
    assert [s.labels["sha256"] for s in series] == [loaded[0].sha256], "the passed-over checkpoint's series is gone"
    with pytest.raises(resume.NoGoodCheckpoint):
        checkpoints.back_to(10, _damaged_at(10))
    found = scraped(metrics)
    assert "lastCheckpoint" not in found and "lastCheckpointStep" not in found, found


def _reading(*series: tuple[str, str, float]) -> dict[str, Any]:
    labels = 'job="j",namespace="ns",attempt="0",precision="fp16"'
    text = "".join(
        f'{tm.LAST_GOOD_CHECKPOINT}{{{labels},sha256="{sha}",checkpoint_precision="{p}"}} {step}\n'
        for sha, p, step in series
    )
    return figures(parse(text + f"{tm.LAST_GOOD_CHECKPOINT_STEP}{{{labels}}} 400\n"), precision="fp16")


def test_a_scrape_between_two_checkpoints_takes_the_newest_and_malformed_labels_are_no_reading() -> None:
    assert _reading(("b" * 64, "bf16", 200), ("c" * 64, "bf16", 400))["lastCheckpoint"]["sha256"] == "c" * 64
    for bad in (("x" * 64, "bf16", 400), ("c" * 63, "bf16", 400), ("c" * 64, "fp64", 400)):
        found = _reading(bad)
        assert "lastCheckpoint" not in found and found["lastCheckpointStep"] == 400


def test_a_step_known_without_its_sha256_gets_it_and_a_reported_one_is_kept() -> None:
    named = {"lastCheckpoint": {"step": 200, "sha256": "d" * 64, "precision": "fp16"}}
    unnamed = running(lastCheckpoint={"step": 200, "precision": "fp16", "sha256": "", "path": ""})
    assert progress_patch(unnamed, named)["lastCheckpoint"]["sha256"] == "d" * 64
    reported = running(lastCheckpoint={"step": 200, "precision": "fp16", "sha256": "e" * 64, "path": "/c/200"})
    assert "lastCheckpoint" not in progress_patch(reported, named)
    newer = running(lastCheckpoint={"step": 400, "precision": "fp16", "sha256": "e" * 64, "path": "/c/400"})
    assert "lastCheckpoint" not in progress_patch(newer, named)
