"""A Hugging Face Trainer's best-model tracking (evaluation_strategy steps, metric_for_best_model,
load_best_model_at_end, an EarlyStoppingCallback) through a fallback: mpjob's checkpoint of a step
the Trainer evaluates holds that evaluation (the save follows it), the fallback attempt carries
the best metric and the early-stopping patience on from it, and a retry that finds the last step
checkpointed leaves the Trainer with its best model and trainer state, as its train() would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.trainer.conftest import in_process_launch, spec
from tests.unit.trainer.test_adapters_arguments import Regression
from tests.unit.trainer.test_adapters_own_checkpoints import FALLBACK, _mpjobs, _samples

pytestmark = pytest.mark.unit

JOB = {"steps": 16, "batchSize": 4, "logEvery": 2, "seed": 0, "learningRate": 1e-2}


def _hf_train(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    precision: str,
    patience: int | None,
    *,
    epochs: bool = False,
    every: int = 4,
) -> Any:
    """An attempt of the job: the Trainer evaluates every 4 steps, where mpjob checkpoints every
    `every` steps (with `epochs`: it evaluates at each epoch's end, every 8 steps, where mpjob
    checkpoints), keeps its best model by
    the greatest eval loss (the loss falls: the first evaluation is the best) and, given a
    `patience`, stops early; returns the Trainer."""
    from transformers import EarlyStoppingCallback, Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    saves = {"everySteps": 8 if epochs else every}
    job = spec(task={"command": ["python", "train.py"]}, training=JOB, precision=FALLBACK, checkpoint=saves)
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    given: dict[str, Any] = {"save_strategy": "steps", "save_steps": 4, "eval_strategy": "steps", "eval_steps": 4}
    if epochs:
        given = {"save_strategy": "epoch", "eval_strategy": "epoch"}
    best = {"load_best_model_at_end": True, "metric_for_best_model": "loss", "greater_is_better": True}
    callbacks = [] if patience is None else [EarlyStoppingCallback(early_stopping_patience=patience)]
    try:
        args = mpjob_hf.training_arguments(run, output_dir=str(tmp_path / "out"), **given, **best)
        data, held_out = _samples(32 if epochs else 64, 0), _samples(16, 1)  # 32: an epoch of 8 steps
        trainer = Trainer(model=Regression(), args=args, train_dataset=data, eval_dataset=held_out, callbacks=callbacks)
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    return trainer


def _evals(trainer: Any) -> list[int]:
    return [e["step"] for e in trainer.state.log_history if "eval_loss" in e]


def _fault_after(tmp_path: Path, step: int) -> None:
    """The fault came after mpjob's checkpoint of `step`: the later ones are not there."""
    for later, folder in _mpjobs(tmp_path).items():
        if later > step:
            shutil.rmtree(folder.parent)


def test_mpjobs_checkpoint_of_an_evaluated_step_holds_that_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the step-8 checkpoint was written before the step-8 evaluation: the fallback
    attempt, resuming there, never ran it, and its log history and best-model tracking lacked it."""
    first = _hf_train(tmp_path, monkeypatch, "bf16", None)
    state = (_mpjobs(tmp_path)[8] / "trainer_state.json").read_text()
    assert _evals(first) == [4, 8, 12, 16] and '"step": 8' in state and "eval_loss" in state
    _fault_after(tmp_path, 8)
    again = _hf_train(tmp_path, monkeypatch, "fp32", None)
    assert _evals(again) == [4, 8, 12, 16]
    assert (again.state.best_global_step, again.state.best_metric) == (4, first.state.best_metric)


def test_mpjobs_checkpoint_at_an_epochs_end_holds_the_epochs_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval_strategy="epoch": the Trainer evaluates after the epoch's last step, once more after
    on_epoch_end; mpjob's checkpoint of that step follows that evaluation too."""
    first = _hf_train(tmp_path, monkeypatch, "bf16", None, epochs=True)
    assert _evals(first) == [8, 16]
    _fault_after(tmp_path, 8)
    again = _hf_train(tmp_path, monkeypatch, "fp32", None, epochs=True)
    assert _evals(again) == [8, 16] and again.state.best_global_step == 8


def test_early_stopping_patience_is_carried_into_the_fallback_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Patience 2, each evaluation after step 4's worse: the Trainer stops at step 12. Before, the
    fallback attempt from step 8 counted its patience from 0 again (transformers restores no
    callback state by default) and without step 8's evaluation: it trained on to step 16."""
    first = _hf_train(tmp_path, monkeypatch, "bf16", 2)
    assert _evals(first) == [4, 8, 12] and first.state.global_step == 12
    _fault_after(tmp_path, 8)
    again = _hf_train(tmp_path, monkeypatch, "fp32", 2)
    assert _evals(again) == [4, 8, 12] and again.state.global_step == 12


def test_a_retry_at_the_last_step_loads_the_best_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a retry that resumed at the last step (its run crashed past the final checkpoint)
    returned the last step's weights and a fresh trainer state, where train() loads the best model."""
    from safetensors.torch import load_file

    first = _hf_train(tmp_path, monkeypatch, "fp32", None)
    best = tmp_path / "out" / "checkpoint-4"
    assert first.state.best_model_checkpoint == str(best)
    again = _hf_train(tmp_path, monkeypatch, "fp32", None)  # every checkpoint there: nothing to train
    held = again.model.state_dict()
    assert all(torch.equal(w, held[k]) for k, w in load_file(best / "model.safetensors").items())
    assert (again.state.global_step, again.state.best_global_step, _evals(again)) == (16, 4, [4, 8, 12, 16])


@pytest.mark.parametrize(
    ("written", "named"),
    [
        ("{not json", "cannot be read as JSON"),
        ("[1, 2]", "not the Trainer's state fields"),
        ('{"global_step": 16, "secret": 1}', "['secret']"),
        ('{"global_step": 16, "best_model_checkpoint": 4}', "best_model_checkpoint is a int, not str"),
        ('{"global_step": 16, "best_metric": "0.5"}', "best_metric is a str, not int"),
    ],
)
def test_a_trainer_state_read_at_the_last_step_is_checked(tmp_path: Path, written: str, named: str) -> None:
    """What the retry at the last step reads of the Trainer's state is checked before it is taken:
    a damaged one is the checkpoint's fault (CorruptCheckpoint: the one before it is resumed)."""
    from mpjob_trainer.adapters.hf_tracking import read_state
    from mpjob_trainer.checkpoint.manifest import CorruptCheckpoint

    folder = tmp_path / "step-000000016" / "framework"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(written)
    with pytest.raises(CorruptCheckpoint) as refused:
        read_state(folder)
    assert "step-000000016: framework/trainer_state.json" in str(refused.value) and named in str(refused.value)


def _plant_best(tmp_path: Path, steps: set[int]) -> Path:
    """A best model's checkpoint of zero weights outside output_dir, named in the trainer state of
    mpjob's checkpoints of `steps`, their manifests recomputed to match (whoever can write the
    store can); returns it."""
    from safetensors.torch import load_file, save_file

    from mpjob_trainer.checkpoint.manifest import hash_files

    planted = tmp_path / "planted" / "checkpoint-4"
    shutil.copytree(tmp_path / "out" / "checkpoint-4", planted)
    weights = load_file(planted / "model.safetensors")
    save_file({k: torch.zeros_like(w) for k, w in weights.items()}, planted / "model.safetensors")
    for step in steps:
        folder = _mpjobs(tmp_path)[step]
        state = json.loads((folder / "trainer_state.json").read_text())
        (folder / "trainer_state.json").write_text(json.dumps({**state, "best_model_checkpoint": str(planted)}))
        manifest = json.loads((folder.parent / "manifest.json").read_text())
        manifest["files"].update(hash_files(folder.parent, [folder / "trainer_state.json"]))
        (folder.parent / "manifest.json").write_text(json.dumps(manifest))
    return planted


def _nothing_zero(trainer: Any) -> bool:
    return all(bool(w.any()) for w in trainer.model.state_dict().values())


def test_a_retry_at_the_last_step_follows_no_best_checkpoint_outside_output_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before, the best model's checkpoint a checkpoint's trainer state names was loaded wherever
    it pointed: the retry at the last step took the planted zero weights."""
    from safetensors.torch import load_file

    _hf_train(tmp_path, monkeypatch, "fp32", None)
    planted = _plant_best(tmp_path, set(_mpjobs(tmp_path)))
    capsys.readouterr()
    again = _hf_train(tmp_path, monkeypatch, "fp32", None)  # every checkpoint there: nothing to train
    held, last = again.model.state_dict(), load_file(_mpjobs(tmp_path)[16] / "model.safetensors")
    assert _nothing_zero(again) and all(torch.equal(w, held[k]) for k, w in last.items())
    assert again.state.best_model_checkpoint is None and again.state.best_global_step == 4
    assert f"names {str(planted)!r}" in capsys.readouterr().err


def test_a_fallback_attempt_follows_no_best_checkpoint_outside_output_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Trainer reads the trainer state of the checkpoint it resumes from itself: before, a
    fallback attempt on a new pod (output_dir gone) ended by loading the planted best model."""
    _hf_train(tmp_path, monkeypatch, "bf16", None)
    _fault_after(tmp_path, 8)
    _plant_best(tmp_path, {8})
    shutil.rmtree(tmp_path / "out")
    capsys.readouterr()
    again = _hf_train(tmp_path, monkeypatch, "fp32", None)
    assert again.state.global_step == 16 and _evals(again) == [4, 8, 12, 16] and _nothing_zero(again)
    assert again.state.best_model_checkpoint is None and "outside output_dir" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("named", "kept"),
    [
        ("out/checkpoint-4", True),
        ("out/link/checkpoint-4", False),
        ("out/../elsewhere/checkpoint-4", False),
        ("elsewhere/checkpoint-4", False),
        ("out\0/checkpoint-4", False),
    ],
    ids=["inside", "link-out", "dot-dot", "outside", "nul"],
)
def test_a_best_checkpoint_is_kept_only_inside_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], named: str, kept: bool
) -> None:
    """Links and `..` resolved: a folder inside output_dir by name only is outside it."""
    from transformers.trainer_callback import TrainerState

    from mpjob_trainer.adapters.hf_tracking import best_inside

    for folder in ("out/checkpoint-4", "elsewhere/checkpoint-4"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "out" / "link").symlink_to(tmp_path / "elsewhere")
    best = str(tmp_path / named)
    state = TrainerState(best_model_checkpoint=best, best_global_step=4)
    best_inside(state, str(tmp_path / "out"))
    assert state.best_model_checkpoint == (best if kept else None) and state.best_global_step == 4
    assert ("not followed" in capsys.readouterr().err) is not kept


def test_a_best_checkpoint_that_is_not_a_name_is_dropped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Trainer reads its own trainer_state.json unchecked (a number where a path belongs): dropped, not a crash."""
    from transformers.trainer_callback import TrainerState

    from mpjob_trainer.adapters.hf_tracking import best_inside

    state = TrainerState(best_model_checkpoint=5, best_global_step=4)  # type: ignore[arg-type]
    best_inside(state, str(tmp_path / "out"))
    assert state.best_model_checkpoint is None and "'5' as the best model's checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("every", [4, 8])
def test_a_retry_of_a_run_that_stopped_early_trains_nothing_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int
) -> None:
    """Patience 2: the Trainer stops after step 12 (of 16). Before, a retry (the attempt crashed
    after its last checkpoint) counted the run done only at step 16: it resumed at step 12 (or 8,
    with no checkpoint at 12) and, the Trainer forgetting its stop when train() begins, trained on
    to step 16 past the user's stop. Now step 12's checkpoint records the stop (also off the
    checkpoint interval): the retry trains nothing and loads the best model, as train() ends."""
    import json

    from safetensors.torch import load_file

    first = _hf_train(tmp_path, monkeypatch, "bf16", 2, every=every)
    assert first.state.global_step == 12 and set(_mpjobs(tmp_path)) >= {12}
    done = json.loads((tmp_path / "report.json").read_text())
    assert (done["reason"], done["step"]) == ("Succeeded", 12) and "stopped early" in done["message"]
    again = _hf_train(tmp_path, monkeypatch, "fp32", 2, every=every)
    assert (again.state.global_step, again.state.best_global_step, _evals(again)) == (12, 4, [4, 8, 12])
    held = again.model.state_dict()
    best = load_file(tmp_path / "out" / "checkpoint-4" / "model.safetensors")
    assert all(torch.equal(w, held[k]) for k, w in best.items())
    assert max(_mpjobs(tmp_path)) == 12  # nothing trained past the stop, nothing saved
    retried = json.loads((tmp_path / "report.json").read_text())
    assert (retried["reason"], retried["step"], retried["startStep"]) == ("Succeeded", 12, 12)
    assert "stopped early" in retried["message"]
