"""The parts of a checkpoint the SDK writes itself (the GradScaler's state, the quarantine, the
spike window) are the file's word like the generators: checked before anything is loaded, so a
checkpoint holding unusable values there is rejected whole (the previous good one used), never
half loaded nor an error that ends the attempt on every rank."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.skipping import SpikeSpec
from mpjob_trainer.checkpoint import CheckpointStore, resume
from mpjob_trainer.quarantine import Quarantine
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.spike import SpikeDetector

pytestmark = pytest.mark.unit

Edit = Callable[[dict[str, Any]], Any]


def _store(root: Path, log: list[dict[str, Any]] | None = None) -> CheckpointStore:
    def record(event: str, **fields: Any) -> None:
        if log is not None:
            log.append({"event": event, **fields})

    return CheckpointStore(root, keep=5, config_digest="d1", log=record, job="ns/j/u1")


def _own() -> dict[str, Any]:
    return {"quarantine": Quarantine(), "spike": SpikeDetector(SpikeSpec(window=8), torch.device("cpu"))}


def _scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=1024.0)


def _write(root: Path, step: int, edit: Edit | None = None) -> None:
    """An fp16 checkpoint of step `step` as the session writes it (a skipped step in its
    quarantine), `edit`ed."""
    own = _own()
    own["quarantine"].add(step - 1, "data", [step])
    state = TrainingState({"model": torch.nn.Linear(2, 2)}, own=own).capture(step, step, "fp16", _scaler())
    if edit is not None:
        edit(state)
    _store(root).write(step, "fp16", state)


BAD_RECORDS = [[3, "data", [7]], ["three", "data", [8]]]  # the first one fine: merged before the second failed


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda s: s["scaler"].update(scale=math.nan), "holds a GradScaler state whose scale is nan"),
        (lambda s: s["scaler"].update(scale="big"), "holds a GradScaler state whose scale is 'big'"),
        (lambda s: s["scaler"].pop("growth_interval"), "holds a GradScaler state without growth_interval"),
        (lambda s: s["scaler"].update(_growth_tracker=-1), "holds a GradScaler state whose _growth_tracker is -1"),
        (lambda s: s.update(scaler=[1.0]), "holds a GradScaler state that is no mapping"),
        (lambda s: s["quarantine"].update(records=BAD_RECORDS), "holds a quarantine record ['three', 'data', [8]]"),
        (lambda s: s["quarantine"].update(records=[[3, "cosmic", []]]), "holds a quarantine record [3, 'cosmic', []]"),
        (lambda s: s.update(quarantine={"records": 5}), "holds a quarantine whose records are no list"),
        (lambda s: s["spike"].pop("accepted"), "holds a spike window without accepted"),
        (lambda s: s["spike"].update(window="x"), "holds a spike window that is no float tensor"),
        (lambda s: s["spike"].update(window=torch.full((8,), math.inf)), "holds a spike window of non-finite"),
        (lambda s: s["spike"].update(accepted=torch.ones(3)), "holds a spike window whose accepted is no count"),
    ],
    ids=[
        "scale-nan",
        "scale-text",
        "scaler-key",
        "scaler-tracker",
        "scaler-list",
        "quarantine-step",
        "quarantine-cause",
        "quarantine-records",
        "spike-key",
        "spike-window",
        "spike-inf",
        "spike-accepted",
    ],
)
def test_a_checkpoint_whose_sdk_parts_are_unusable_is_rejected_whole_for_the_previous_one(
    tmp_path: Path, edit: Edit, problem: str
) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20, edit)
    log: list[dict[str, Any]] = []
    model, own, scaler = torch.nn.Linear(2, 2), _own(), _scaler()
    into = TrainingState({"model": model}, own=own)
    loaded = resume.load(_store(tmp_path, log), restore=lambda got: into.restore(got[1], "fp16", scaler))
    assert loaded is not None and loaded[0].step == 10
    assert "step-000000020" in log[0]["path"] and problem in log[0]["problem"], log
    assert own["quarantine"].steps == [9]  # step 10's record alone: nothing of step 20's merged
    assert scaler.state_dict()["scale"] == 1024.0


def test_a_checkpoint_written_before_the_sdk_parts_existed_still_loads(tmp_path: Path) -> None:
    _write(tmp_path, 10, lambda s: [s.pop("quarantine"), s.pop("spike"), s.update(scaler=None)])
    own = _own()
    into = TrainingState({"model": torch.nn.Linear(2, 2)}, own=own)
    loaded = resume.load(_store(tmp_path), restore=lambda got: into.restore(got[1], "fp16", _scaler()))
    assert loaded is not None and loaded[0].step == 10 and own["quarantine"].steps == []
