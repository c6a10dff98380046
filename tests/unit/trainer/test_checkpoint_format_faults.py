"""A format-1 checkpoint's optimizer state is checked before it is brought forward, and what does
not fit is told apart: a state no optimizer writes, or one that disagrees with the checkpoint's
own weights, is the checkpoint's fault (CorruptCheckpoint: the resume passes it over for the one
before it); a sound state that does not fit this run's model or optimizer, because the user
changed them, is a configuration error that names what to do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.api import Task
from mpjob_trainer import speed
from mpjob_trainer.checkpoint import CheckpointStore, CorruptCheckpoint, resume
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.tasks import load_task
from tests.unit.trainer.conftest import spec
from tests.unit.trainer.test_checkpoint_format import FORMAT_1, _store

pytestmark = pytest.mark.unit


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))


def _format_1(store: CheckpointStore, step: int, malformed: dict[str, Any] | None = None) -> Path:
    """A user's checkpoint of `step` (one SGD group), its optimizer state overlaid with `malformed`
    before it is written (so its sha256 is the manifest's), rewritten as format 1."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    state = TrainingState({"model": model, "optimizer": optimizer}).capture(step, step, "fp32", None)
    state["optimizer"] = {**state["optimizer"], **(malformed or {})}
    folder = Path(store.write(step, "fp32", state).ref.path)
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest["formatVersion"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _two_group_run() -> TrainingState:
    model = _model()
    params = list(model.parameters())
    optimizer = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1, momentum=0.9)
    return TrainingState({"model": model, "optimizer": optimizer})


MALFORMED: dict[str, dict[str, Any]] = {
    "state-a-list": {"state": [1, 2], "param_groups": "x"},
    "per-parameter-a-string": {"state": {0: "x"}},
    "params-a-number": {"param_groups": [{"params": 3}]},
    "group-a-string": {"param_groups": ["x"]},
    "an-id-twice": {"param_groups": [{"lr": 0.1, "params": [0, 0, 1, 2]}]},
    "no-groups": {"param_groups": []},
}


@pytest.mark.parametrize("malformed", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_format_1_optimizer_state_of_no_optimizers_shape_is_the_checkpoints_fault(
    tmp_path: Path, malformed: dict[str, Any]
) -> None:
    """Read from the store, so it may hold any plain value: never a ConfigError that ends the job
    (anyone who can write the store could end it so), nor a TypeError taken for an infrastructure
    failure."""
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _, state = store.verify(_format_1(store, 5, malformed))
    with pytest.raises(CorruptCheckpoint, match=r"checkpoint format 1: its 'optimizer' is no optimizer state: "):
        _two_group_run().restore(state, "fp32", None)


def test_a_resume_passes_a_malformed_format_1_checkpoint_over_for_the_one_before_it(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    _format_1(store, 5)
    _format_1(store, 10, MALFORMED["params-a-number"])
    rejected: list[dict[str, Any]] = []
    store.log = lambda event, **f: rejected.append({"event": event, **f})
    run = _two_group_run()

    def restore(found: resume.Loaded) -> None:
        run.restore(found[1], "fp32", None)

    loaded = resume.load(store, restore=restore)
    assert loaded is not None and loaded[0].step == 5
    assert [(r["event"], Path(r["path"]).name) for r in rejected] == [("checkpointRejected", "step-000000010")]
    assert "is no optimizer state" in rejected[0]["problem"]


def _builtin(tmp_path: Path, hidden: int) -> tuple[dict[str, Any], TrainingState]:
    """The format-1 fixture's state, verified, and a run of the builtin mlp of width `hidden`."""
    root = tmp_path / "ckpt"
    root.mkdir()
    shutil.copytree(FORMAT_1, root / FORMAT_1.name)
    job = spec(training={"steps": 20})
    _, state = _store(root, job).verify(root / FORMAT_1.name)
    job["task"]["args"]["hidden"] = hidden
    model = load_task(Task.model_validate(job["task"])).model
    optimizer = speed.adamw(model, lr=1e-2, weight_decay=0.1)
    return state, TrainingState({"model": model, "optimizer": optimizer})


def test_a_format_1_optimizer_state_the_checkpoints_own_weights_disagree_with_is_its_fault(tmp_path: Path) -> None:
    state, run = _builtin(tmp_path, hidden=16)
    first = state["optimizer"]["param_groups"][0]["params"][0]
    state["optimizer"]["state"][first]["exp_avg"] = torch.zeros(3, 3)
    with pytest.raises(
        CorruptCheckpoint, match=r"state 'exp_avg' has shape \(3, 3\) where the checkpoint's own weight"
    ):
        run.restore(state, "fp32", None)


def test_a_format_1_checkpoint_of_a_model_the_user_changed_stays_a_configuration_error(tmp_path: Path) -> None:
    state, run = _builtin(tmp_path, hidden=32)  # written at width 16: the same parameters, other shapes
    with pytest.raises(
        ConfigError, match=r"the model changed since it was written \(its parameters, or .*\): start afresh"
    ):
        run.restore(state, "fp32", None)
