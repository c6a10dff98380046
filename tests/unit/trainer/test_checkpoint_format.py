"""The checkpoint format is versioned: today's checkpoints say `formatVersion: 2`, a format-1
checkpoint of the builtin loop (one AdamW parameter group, written before the decay / no-decay
split) resumes with each parameter's Adam state moved into the group it now belongs to, a
user's format-1 checkpoint whose optimizer still matches loads as before, and what cannot be
read or mapped is refused with the format named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from mpjob_contract.api import Task
from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer import speed
from mpjob_trainer.checkpoint import FORMAT_VERSION, CheckpointStore, resume
from mpjob_trainer.errors import ConfigError
from mpjob_trainer.session.attempt import config_digest
from mpjob_trainer.session.state import TrainingState
from mpjob_trainer.tasks import load_task
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

#: Written by the builtin loop as of commit c539383^ (one AdamW group over model.parameters()),
#: job spec() of conftest with training.steps 10: see fixtures/README.md.
FORMAT_1 = Path(__file__).parent / "fixtures" / "v1-mlp" / "step-000000010"


def _job(steps: int = 20) -> dict[str, Any]:
    return spec(training={"steps": steps})


def _store(root: Path, job: dict[str, Any], keep: int = 5) -> CheckpointStore:
    launch = AttemptLaunch.model_validate(
        {"jobName": "t", "precision": "fp32", "checkpointDir": str(root), "spec": job}
    )
    return CheckpointStore(root, keep=keep, config_digest=config_digest(launch))


def _copy_fixture(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copytree(FORMAT_1, root / FORMAT_1.name))


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def test_the_fixture_is_a_format_1_checkpoint_with_one_optimizer_group() -> None:
    assert "formatVersion" not in _manifest(FORMAT_1)
    state = torch.load(FORMAT_1 / "state.pt", weights_only=True)
    assert len(state["optimizer"]["param_groups"]) == 1


def test_a_format_1_builtin_checkpoint_resumes_with_adam_state_moved_by_parameter(tmp_path: Path) -> None:
    job = _job()
    store = _store(tmp_path / "ckpt", job)
    _copy_fixture(tmp_path / "ckpt")
    loaded = resume.load(store)
    assert loaded is not None
    ref, state = loaded
    assert ref.step == 10 and state["formatVersion"] == 1
    saved = torch.load(FORMAT_1 / "state.pt", weights_only=True)["optimizer"]

    model = load_task(Task.model_validate(job["task"])).model
    optimizer = speed.adamw(model, lr=1e-2, weight_decay=0.1)
    assert len(optimizer.param_groups) == 2
    applied = TrainingState({"model": model, "optimizer": optimizer}).restore(state, "fp32", None)
    assert applied == 10

    params = list(model.parameters())
    moved = 0
    for index, param in enumerate(params):  # format 1: entry `index` of the one group is params[index]
        old = saved["state"][saved["param_groups"][0]["params"][index]]
        new = optimizer.state[param]
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(new[key], old[key]), (index, key)
        moved += 1
    assert moved == len(params) == 8
    decay, no_decay = optimizer.param_groups
    assert {id(p) for p in decay["params"]} == {id(p) for p in params if p.dim() >= 2}
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    old_group = saved["param_groups"][0]
    assert all(group["lr"] == old_group["lr"] and group["betas"] == old_group["betas"] for group in (decay, no_decay))
    for key, value in torch.load(FORMAT_1 / "state.pt", weights_only=True)["model"].items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.process
def test_the_trainer_trains_on_from_a_format_1_checkpoint_and_writes_format_2(tmp_path: Path) -> None:
    _copy_fixture(tmp_path / "ckpt")
    run = run_trainer(tmp_path, _job(20))
    assert run.code == 0, run.stderr
    assert run.of("resume")[0]["step"] == 10 and not run.of("checkpointRejected")
    assert [e["step"] for e in run.of("checkpoint")] == [20]
    newest = tmp_path / "ckpt" / "step-000000020"
    assert _manifest(newest)["formatVersion"] == FORMAT_VERSION == 2
    trained = torch.load(newest / "state.pt", weights_only=True)
    assert trained["appliedSteps"] == 20 and len(trained["optimizer"]["param_groups"]) == 2
    before = torch.load(FORMAT_1 / "state.pt", weights_only=True)["model"]
    assert any(not torch.equal(trained["model"][k], v) for k, v in before.items()), "it trained on"


def _sdk_state(tmp_path: Path, groups: int) -> tuple[CheckpointStore, Path, nn.Module]:
    """A user's checkpoint (a plain SGD with `groups` groups), rewritten as format 1."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    chunks = [params] if groups == 1 else [params[:2], params[2:]]
    optimizer = torch.optim.SGD([{"params": c} for c in chunks], lr=0.1, momentum=0.9)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    state = TrainingState({"model": model, "optimizer": optimizer}).capture(5, 5, "fp32", None)
    folder = Path(store.write(5, "fp32", state).ref.path)
    manifest = _manifest(folder)
    assert manifest.pop("formatVersion") == 2
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return store, folder, model


def test_a_users_format_1_checkpoint_loads_as_before_when_the_optimizer_matches(tmp_path: Path) -> None:
    store, folder, written = _sdk_state(tmp_path, groups=2)
    _, state = store.verify(folder)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    params = list(model.parameters())
    optimizer = torch.optim.SGD([{"params": params[:2]}, {"params": params[2:]}], lr=0.1, momentum=0.9)
    TrainingState({"model": model, "optimizer": optimizer}).restore(state, "fp32", None)
    for mine, theirs in zip(params, written.parameters(), strict=True):
        assert torch.equal(mine, theirs)
    assert torch.equal(optimizer.state[params[3]]["momentum_buffer"], state["optimizer"]["state"][3]["momentum_buffer"])


def test_a_format_1_optimizer_that_cannot_be_mapped_names_the_format_and_what_to_do(tmp_path: Path) -> None:
    store, folder, _ = _sdk_state(tmp_path, groups=1)
    _, state = store.verify(folder)
    other = nn.Linear(3, 4)  # the optimizer trains a module whose parameters differ from the group's
    groups: list[dict[str, Any]] = [{"params": [other.weight]}, {"params": [other.bias]}]
    optimizer = torch.optim.SGD(groups, lr=0.1)
    with pytest.raises(ConfigError, match=r"checkpoint format 1.*start afresh in a new checkpoint folder"):
        TrainingState({"model": other, "optimizer": optimizer}).restore(state, "fp32", None)


def test_a_checkpoint_of_a_newer_format_is_refused_by_name_and_the_previous_one_used(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=5, config_digest="d")
    for step in (10, 20):
        store.write(step, "fp32", {"step": step})
    newest = tmp_path / "step-000000020"
    manifest = _manifest(newest)
    manifest["formatVersion"] = FORMAT_VERSION + 1
    (newest / "manifest.json").write_text(json.dumps(manifest))
    rejected: list[str] = []
    store.log = lambda event, **f: rejected.append(f["problem"])
    loaded = resume.load(store)
    assert loaded is not None and loaded[0].step == 10
    assert rejected == [
        f"step-000000020: checkpoint format {FORMAT_VERSION + 1}, this trainer reads formats 1 to {FORMAT_VERSION}: "
        "resume it with a trainer image at least as new as the one that wrote it"
    ]
