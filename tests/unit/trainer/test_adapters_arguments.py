"""A framework's own settings the adapters must own: a Hugging Face Trainer given its own
TrainingArguments passes the Trainer's own saves (the script's output) and the arguments that
only shape saves, logging or reporting; a Lightning Trainer the script built itself whose
precision or steps are not the attempt's is refused, naming the setting. Lightning's
fp32 replay clips the gradients as its training does: by value or by norm
(gradient_clip_algorithm), or as the module's own `configure_gradient_clipping` does."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from mpjob_trainer.errors import ConfigError
from tests import warm
from tests.helpers import NO_PLOT, run_to_end
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: bool = True, **given: Any) -> None:
    """`train` with a Trainer built from the script's own TrainingArguments (those the attempt
    sets, plus `given`)."""
    from transformers import Trainer, TrainingArguments

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        attempt = mpjob_hf.attempt_arguments(run)
        args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to=[], **{**attempt, **given})
        trainer = Trainer(model=Regression(), args=args)
        if not model:
            trainer.model = None  # stops `train` right after the arguments are checked
        mpjob_hf.train(run, trainer)
    finally:
        run.close()


def test_arguments_that_save_or_only_shape_saves_and_reports_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer's own saves (save_strategy, save_only_model: the script's output, in its
    output_dir outside mpjob's checkpoint folder), save_steps, save_total_limit and logging_steps:
    `train` goes past the check (load_best_model_at_end: test_adapters_own_checkpoints.py)."""
    given = {
        "save_strategy": "steps",
        "save_only_model": True,
        "save_steps": 5,
        "save_total_limit": 2,
        "logging_steps": 3,
    }
    with pytest.raises(ConfigError, match="the Trainer has no model"):
        _train(tmp_path, monkeypatch, model=False, **given)


def test_a_scripts_own_fp16_gives_way_to_the_fallback_attempts_bf16(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A script that hard-codes TrainingArguments(fp16=True) trained its fp16 attempt, and its
    bf16 fallback attempt ended ConfigError: the job failed at the very fallback it ran for. The
    attempt's precision wins (the model trains under bf16 autocast) and the script is told."""
    from transformers import Trainer, TrainingArguments

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]}, precision={"mode": "fp16", "fallback": ["bf16"]})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "bf16"))
    model, dtypes = Regression(), set()
    model.linear.register_forward_hook(lambda module, args, out: dtypes.add(out.dtype))
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(16)]
    try:
        args = TrainingArguments(
            output_dir=str(tmp_path / "out"), report_to=[], fp16=True, use_cpu=True, save_strategy="no", max_steps=30
        )
        trainer = Trainer(model=model, args=args, train_dataset=data)
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    assert dtypes == {torch.bfloat16}
    assert (trainer.args.fp16, trainer.args.bf16, trainer.accelerator.mixed_precision) == (False, True, "bf16")
    told = capfd.readouterr().err
    assert "TrainingArguments(fp16=True)" in told and "trains in bf16" in told


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"eval_strategy": "steps", "load_best_model_at_end": True}, "load_best_model_at_end"),
        ({"lr_scheduler_type": "sawtooth"}, "sawtooth"),
    ],
)
def test_training_arguments_transformers_refuses_are_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: dict[str, Any], named: str
) -> None:
    """Arguments TrainingArguments refuses (its ValueError) end the attempt as a ConfigError with
    transformers' reason, not as a failure of no known kind that is retried."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        with pytest.raises(ConfigError) as refused:
            mpjob_hf.training_arguments(run, **given)
    finally:
        run.close()
    assert named in str(refused.value) and "TrainingArguments" in str(refused.value)


def test_training_arguments_take_the_specs_weight_decay_and_warmup_unless_the_script_sets_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    job = spec(task={"command": ["python", "train.py"]}, training={"weightDecay": 0.05, "warmupSteps": 7})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        specs, own = mpjob_hf.training_arguments(run), mpjob_hf.training_arguments(run, weight_decay=0, warmup_steps=2)
    finally:
        run.close()
    assert (specs.weight_decay, specs.warmup_steps) == (0.05, 7)
    assert (own.weight_decay, own.warmup_steps) == (0, 2)


class Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y) * 100  # gradients far over the clip

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1.0)


@pytest.mark.parametrize(
    ("precision", "given", "named"),
    [
        ("fp16", {"precision": "16-mixed", "max_steps": 2}, "precision"),  # on a CPU Lightning trains it in bf16
        ("fp32", {"precision": "bf16-mixed", "max_steps": 2}, "precision"),
        ("fp32", {"precision": "32-true", "max_steps": 100}, "max_steps"),
    ],
)
def test_a_lightning_trainer_not_built_from_the_attempts_settings_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, precision: str, given: dict[str, Any], named: str
) -> None:
    """A Trainer the script builds itself, with mpjob's callback but its own precision, steps or
    checkpoints, would train in a precision the attempt does not report (and without its
    GradScaler), past the attempt's steps, or save outside mpjob's store: `fit` refuses it,
    naming the setting, before it trains."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 2, "batchSize": 8, "seed": 0})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, precision))
    try:
        callback = mpjob_lightning.MpjobCallback(run)
        trainer = L.Trainer(callbacks=[callback], logger=False, default_root_dir=str(tmp_path / "own"), **given)
        with pytest.raises(ConfigError) as refused:
            mpjob_lightning.fit(run, trainer, Linear(), train_dataloaders=loader)
    finally:
        run.close()
    assert named in str(refused.value) and "trainer_settings(run" in str(refused.value)
    assert trainer.global_step == 0 and not list(tmp_path.glob("ckpt/step-*"))  # refused before it trained


def test_a_scripts_own_lightning_precision_plugin_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that keeps a precision plugin would get Lightning's own exception at
    `L.Trainer(...)` (a precision given twice), a failure of no known kind that is retried:
    trainer_settings refuses it, as it refuses `precision=`. Its ModelCheckpoint is kept
    (tests/unit/trainer/test_adapters_own_checkpoints.py)."""
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.plugins.precision import MixedPrecision

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 2, "batchSize": 8, "seed": 0})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    mine = ModelCheckpoint(dirpath=str(tmp_path / "best"))
    try:
        settings = mpjob_lightning.trainer_settings(run, logger=False, callbacks=[mine])
        with pytest.raises(ConfigError) as refused:
            mpjob_lightning.trainer_settings(run, logger=False, plugins=[MixedPrecision("bf16-mixed", "cpu")])
    finally:
        run.close()
    assert mine in settings["callbacks"] and settings["enable_checkpointing"]
    assert "MixedPrecision" in str(refused.value) and "spec.precision" in str(refused.value)


@pytest.mark.parametrize("algorithm", ["value", "norm"])
def test_the_lightning_replay_clips_gradients_as_training_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    """The replayed step clips by the Trainer's gradient_clip_algorithm and gradient_clip_val: by
    value, SGD at lr 1 moves each weight by exactly the clip value; by norm, all of them by that much."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16) + 10)
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 2, "batchSize": 8, "seed": 0})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        settings = mpjob_lightning.trainer_settings(
            run, logger=False, gradient_clip_val=0.01, gradient_clip_algorithm=algorithm
        )
        trainer, module = L.Trainer(**settings), Linear()
        mpjob_lightning.fit(run, trainer, module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=8))
        before = torch.cat([p.detach().flatten().clone() for p in module.parameters()])
        run.run_step(1)  # the replay's step, on the batch Lightning trained step 1 on
        moved = torch.cat([p.detach().flatten() for p in module.parameters()]) - before
    finally:
        run.close()
    if algorithm == "value":
        assert torch.allclose(moved.abs(), torch.full_like(moved, 0.01))
    else:
        assert float(moved.norm()) == pytest.approx(0.01, rel=1e-4)


class OwnClipping(Linear):
    """Clips each gradient element to 0.01 in its own `configure_gradient_clipping`, whatever the
    Trainer's gradient_clip_val; keeps how far each optimizer step moved its weights."""

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: Any = None, gradient_clip_algorithm: Any = None
    ) -> None:
        torch.nn.utils.clip_grad_value_(self.parameters(), 0.01)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        optimizer = super().configure_optimizers()
        weights = lambda: torch.cat([p.detach().flatten().clone() for p in self.parameters()])  # noqa: E731
        self.moves: list[torch.Tensor] = []
        optimizer.register_step_pre_hook(lambda *_: self.moves.append(weights()))
        optimizer.register_step_post_hook(lambda *_: self.moves.append(weights() - self.moves.pop()))
        return optimizer


def test_the_lightning_replay_clips_gradients_as_the_modules_configure_gradient_clipping_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning clips through the module's `configure_gradient_clipping` hook: an override clips
    in training (SGD at lr 1 moves each weight by exactly its 0.01) and in the replayed step too."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16) + 10)
    training = {"steps": 2, "batchSize": 8, "seed": 0, "gradClipNorm": 1.0}  # the Trainer's: by norm at 1
    job = spec(task={"command": ["python", "train.py"]}, training=training)
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        trainer, module = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False)), OwnClipping()
        mpjob_lightning.fit(run, trainer, module, train_dataloaders=torch.utils.data.DataLoader(data, batch_size=8))
        run.run_step(1)  # the replay's step, on the batch Lightning trained step 1 on
    finally:
        run.close()
    trained, replayed = module.moves[1], module.moves[2]
    assert len(module.moves) == 3 and torch.allclose(trained.abs(), torch.full_like(trained, 0.01))
    torch.testing.assert_close(replayed, trained)


class ManualLinear(Linear):
    """Lightning's manual optimization: `training_step` runs backward and steps by itself."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        loss = super().training_step(batch, index)
        optimizer = self.optimizers()
        self.manual_backward(loss)
        optimizer.step()  # type: ignore[union-attr]
        optimizer.zero_grad()  # type: ignore[union-attr]
        return loss


def _fit_manual(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **training: Any) -> Any:
    """`fit` a ManualLinear for 2 steps under the spec's `training`; the Trainer."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    data = torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16))
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 2, "batchSize": 8, **training})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))
    try:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False, enable_model_summary=False))
        mpjob_lightning.fit(
            run, trainer, ManualLinear(), train_dataloaders=torch.utils.data.DataLoader(data, batch_size=8)
        )
    finally:
        run.close()
    return trainer


def test_a_manually_optimized_lightning_module_trains_under_the_default_clip_norm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Lightning refuses a `gradient_clip_val` under manual optimization (a MisconfigurationException,
    retried as an infrastructure failure): the spec's gradClipNorm (1.0 unless set) is then the
    module's to apply, as its learning rate is, and the script is told so."""
    trainer = _fit_manual(tmp_path, monkeypatch)
    assert trainer.global_step == 2 and trainer.gradient_clip_val is None
    told = capfd.readouterr().err
    assert "spec.training.gradClipNorm=1.0" in told and "self.clip_gradients" in told


def test_a_manually_optimized_lightning_module_under_gradient_accumulation_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning accumulates nothing under manual optimization (and refuses `accumulate_grad_batches`):
    the spec's samples per step cannot be trained, whatever retry follows."""
    with pytest.raises(ConfigError, match=r"spec\.training\.gradAccumulation \(2\).*manual optimization"):
        _fit_manual(tmp_path, monkeypatch, gradAccumulation=2)


@pytest.mark.process
def test_the_hf_replay_under_ddp_steps_with_the_gradients_training_stepped_with(tmp_path: Path) -> None:
    """A model normalising its loss over the step's items on every process (`num_items_in_batch`,
    averaged across processes): the Trainer multiplies its loss by the world size before DDP
    averages the gradients, and the fp32 replay of a step must too, or it steps with half of them."""
    items = Path(__file__).with_name("hf_items_script.py")
    job = spec(
        task={"command": [sys.executable, str(items), str(tmp_path)]},
        training={"steps": 3, "batchSize": 4, "learningRate": 1e-12, "gradClipNorm": 0},
    )  # the weights stay where the replayed step found them
    job["resources"] = {"gpusPerWorker": 0, "processesPerWorker": 2}
    manifest = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "items"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**manifest, "spec": job}))
    command = [sys.executable, "-m", "mpjob.cli", "run", str(tmp_path / "job.yaml"), "--out", str(tmp_path / "out")]
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}, frameworks=True)
    result = run_to_end([*command, *NO_PLOT], tmp_path / "out", 300, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["replayed"] == pytest.approx(seen["trained"], rel=1e-5)
