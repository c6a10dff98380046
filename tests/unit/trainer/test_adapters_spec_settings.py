"""A framework script's own micro-batch and accumulation against the spec's, under both adapters.

The samples per step are the job's (a resume holds to them; the operator splits them for a
fallback into fp32 or an out-of-memory): a script's own per_device_train_batch_size,
gradient_accumulation_steps or accumulate_grad_batches that is neither the job's nor the
attempt's is a ConfigError naming both; one that is the job's trains in the attempt's split,
and the script is told. Before, the script's won: a split attempt trained the unsplit batch
while its report said the split. A Trainer's own learning rate, weight decay, warm-up or clip
norm that are not the spec's train, and the script is told."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from mpjob_contract.launch import AttemptLaunch
from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.conftest import in_process_launch, spec

pytestmark = pytest.mark.unit


def _launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **split: int) -> AttemptLaunch:
    """An fp32 attempt of a job of micro-batch 8 x 1, in the operator's split `split` (microBatch=,
    gradAccumulation=) when given."""
    launch = in_process_launch(tmp_path, monkeypatch, spec(task={"command": ["python", "train.py"]}), "fp32")
    return AttemptLaunch.model_validate({**launch.model_dump(by_alias=True), **split})


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.batches: list[int] = []  # the samples of each micro-batch it trained on

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        self.batches.append(x.shape[0])
        return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}


def _hf(launch: AttemptLaunch, own: dict[str, Any] | None = None, **given: Any) -> tuple[Regression, Any]:
    """Train under the HF adapter: with the script's own TrainingArguments (`own`, plus the
    attempt's) or training_arguments(run, **given); the model and the arguments it trained with."""
    from transformers import Trainer, TrainingArguments

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf

    run = mpjob.start(launch=launch)
    model = Regression()
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(64)]
    try:
        if own is None:
            args = mpjob_hf.training_arguments(run, dataloader_num_workers=0, **given)
        else:
            attempt = mpjob_hf.attempt_arguments(run)
            no_saves = {"save_strategy": "no"}  # transformers' default saves every 500 steps
            args = TrainingArguments(
                output_dir=str(launch.checkpoint_dir), report_to=[], **{**attempt, **no_saves, **own}
            )
        trainer = Trainer(model=model, args=args, train_dataset=data)  # type: ignore[arg-type]
        mpjob_hf.train(run, trainer)
    finally:
        run.close()
    return model, trainer.args


@pytest.mark.parametrize(
    ("own", "named"),
    [
        ({"per_device_train_batch_size": 4}, "per_device_train_batch_size=4 is not spec.training.batchSize (8)"),
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2 is not spec.training.gradAccumulation (1)"),
    ],
)
@pytest.mark.parametrize("path", ["training_arguments", "own TrainingArguments"])
def test_a_hf_scripts_own_batch_shape_unlike_the_specs_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own: dict[str, Any], named: str, path: str
) -> None:
    launch = _launch(tmp_path, monkeypatch)
    with pytest.raises(ConfigError) as refused:
        _hf(launch, **({"own": own} if path != "training_arguments" else own))
    assert named in str(refused.value) and "set spec.training." in str(refused.value)


@pytest.mark.parametrize("path", ["training_arguments", "own TrainingArguments"])
def test_a_split_hf_attempt_trains_its_split_where_the_script_gives_the_jobs_shape(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], path: str
) -> None:
    """The job's 8 x 1, split 4 x 2 by the operator: the Trainer trains micro-batches of 4, two a
    step (30 steps: 60 forwards), and the script is told; before, it trained 30 batches of 8."""
    launch = _launch(tmp_path, monkeypatch, microBatch=4, gradAccumulation=2)
    given = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1}
    model, args = _hf(launch, **({"own": given} if path != "training_arguments" else given))
    assert model.batches == [4] * 60
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (4, 2)
    assert "per_device_train_batch_size=8 -> 4, gradient_accumulation_steps=1 -> 2" in capfd.readouterr().err


def test_a_hf_trainers_own_learning_rate_trains_and_is_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The script's own TrainingArguments without a learning rate: transformers' 5e-5 trains, not
    the spec's 1e-2, and the script is told, naming both (before: nothing said)."""
    _, args = _hf(_launch(tmp_path, monkeypatch), own={"per_device_train_batch_size": 8, "weight_decay": 0.1})
    told = capfd.readouterr().err
    assert args.learning_rate == 5e-5
    assert "TrainingArguments(learning_rate=5e-05) are not the spec's (spec.training.learningRate=0.01)" in told


def test_the_learning_rate_note_is_said_once_a_run_and_not_for_training_arguments_overrides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The note came at every attempt (each retry and fallback's log said it again), and also for
    `training_arguments(learning_rate=...)`, the documented override. Now the first attempt says it
    for the script's own TrainingArguments only; the override and the transformers default train."""
    _, args = _hf(_launch(tmp_path / "a", monkeypatch), learning_rate=3e-4, warmup_steps=2)
    assert (args.learning_rate, args.warmup_steps) == (3e-4, 2)
    assert "are not the spec's" not in capfd.readouterr().err
    _, args = _hf(_launch(tmp_path / "b", monkeypatch, attempt=1), own={"per_device_train_batch_size": 8})
    assert args.learning_rate == 5e-5
    assert "are not the spec's" not in capfd.readouterr().err
    _, args = _hf(_launch(tmp_path / "c", monkeypatch), learning_rate=3e-4)
    args.learning_rate = 1e-3  # changed after training_arguments built them: the script's own again
    told = _told_after(args, tmp_path / "d", monkeypatch, capfd)
    assert "TrainingArguments(learning_rate=0.001) are not the spec's (spec.training.learningRate=0.01)" in told


def _told_after(args: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> str:
    """What the first attempt tells of the TrainingArguments `args`."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters.hf_arguments import tell_unlike_spec

    capfd.readouterr()
    run = mpjob.start(launch=_launch(tmp_path, monkeypatch))
    try:
        tell_unlike_spec(run, args)
    finally:
        run.close()
    return capfd.readouterr().err


def test_training_arguments_refuse_epochs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """num_train_epochs would be ignored for the spec's max_steps: refused, naming spec.training.steps."""
    with pytest.raises(ConfigError, match=r"num_train_epochs=\.\.\.\): set by the attempt .*spec.training.steps"):
        _hf(_launch(tmp_path, monkeypatch), num_train_epochs=2)


@pytest.mark.parametrize("path", ["training_arguments", "own TrainingArguments"])
def test_a_hf_trainers_own_batch_size_search_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """auto_find_batch_size: the Trainer halves its micro-batch itself on an out-of-memory (its
    accumulation kept: fewer samples per step than the job's) and, resuming, takes the one in the
    checkpoint's trainer state back over the attempt's. Before, an attempt the operator split 4 x 2
    that resumed from an unsplit attempt's checkpoint trained micro-batches of 8, two a step: twice
    the job's samples per step, in the memory the split was made to spare. Refused, naming it."""
    launch = _launch(tmp_path, monkeypatch, microBatch=4, gradAccumulation=2)
    given = {"per_device_train_batch_size": 8, "auto_find_batch_size": True}
    with pytest.raises(ConfigError) as refused:
        _hf(launch, **({"own": given} if path != "training_arguments" else given))
    assert "auto_find_batch_size=True" in str(refused.value) and "spec.training.batchSize" in str(refused.value)


@pytest.mark.parametrize("path", ["training_arguments", "own TrainingArguments"])
def test_a_hf_trainer_that_ignores_the_data_skip_on_resume_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """ignore_data_skip: a Trainer resumed mid-epoch from mpjob's checkpoint starts the epoch's data
    from its first batch. Before, an attempt resumed at step 10 (8 steps an epoch) trained the
    epoch's batches 0, 1, ... where a straight run trains 2, 3, ...; re-entered after a bad batch
    from a mid-epoch checkpoint, its quarantined step skipped another batch. Refused, naming it."""
    given = {"per_device_train_batch_size": 8, "ignore_data_skip": True}
    with pytest.raises(ConfigError) as refused:
        _hf(_launch(tmp_path, monkeypatch), **({"own": given} if path != "training_arguments" else given))
    assert "TrainingArguments(ignore_data_skip=True)" in str(refused.value)


class Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)
        self.steps_at: list[int] = []  # the global step at each batch

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        self.steps_at.append(self.trainer.global_step)
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _lightning(
    launch: AttemptLaunch, own: bool, accumulate: int, module: Module | None = None, batch: int = 4
) -> Module:
    """Fit `module` (a new one: None) under the Lightning adapter on a DataLoader of `batch` samples
    a batch, the Trainer's accumulation `accumulate` given to trainer_settings or set after it (`own`)."""
    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning

    run = mpjob.start(launch=launch)
    module = module or Module()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(512, 4), torch.randn(512)), batch)
    try:
        settings = mpjob_lightning.trainer_settings(run, logger=False, enable_model_summary=False)
        if own:  # the script set it on the Trainer after trainer_settings
            settings["accumulate_grad_batches"] = accumulate
        else:
            settings = mpjob_lightning.trainer_settings(
                run, logger=False, enable_model_summary=False, accumulate_grad_batches=accumulate
            )
        mpjob_lightning.fit(run, L.Trainer(**settings), module, train_dataloaders=loader)
    finally:
        run.close()
    return module


@pytest.mark.parametrize("own", [False, True])
def test_lightnings_accumulation_is_the_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str], own: bool
) -> None:
    """accumulate_grad_batches=3 in a job of 1 is a ConfigError naming both; the job's 1 in an
    attempt split to 2 trains two batches a step, told (before: one batch a step, 1 as given)."""
    with pytest.raises(ConfigError, match=r"accumulate_grad_batches=3 is not spec.training.gradAccumulation \(1\)"):
        _lightning(_launch(tmp_path / "a", monkeypatch), own, 3)
    module = _lightning(_launch(tmp_path / "b", monkeypatch, microBatch=4, gradAccumulation=2), own, 1)
    assert module.steps_at == [step for step in range(30) for _ in range(2)]
    assert "accumulate_grad_batches=1 -> 2" in capfd.readouterr().err


def test_a_lightning_batch_larger_than_the_attempts_micro_batch_is_a_configuration_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job's 8 x 1 split 4 x 2 by the operator, the script's DataLoader still of 8: a
    ConfigError naming both and how to build the loader, before its first batch trains (before:
    nothing checked it, and every step trained 16 samples while the report said 8)."""
    module = Module()
    with pytest.raises(ConfigError) as refused:
        _lightning(_launch(tmp_path / "a", monkeypatch, microBatch=4, gradAccumulation=2), False, 1, module, batch=8)
    assert str(refused.value) == (
        "the DataLoader gave a batch of 8 samples, more than the attempt's micro-batch 4 (spec.training.batchSize "
        "is 8; this attempt's split trains 4): the operator halves it after a fallback into fp32 or an "
        "out-of-memory, and the adapter cannot reach your loader; build it with "
        "DataLoader(..., batch_size=run.spec.training.batch_size)"
    )
    assert module.steps_at == []
    unsplit = _lightning(_launch(tmp_path / "b", monkeypatch), False, 1, batch=8)  # the job's own 8 x 1 trains
    assert unsplit.steps_at == list(range(30))


class Interrupted(Exception):
    pass


class EpochModule(Module):
    """Module, recording Lightning's epoch at each batch too; `stop_at`: ends the attempt (as a
    crash does) at that step's first batch."""

    def __init__(self, stop_at: int | None = None) -> None:
        super().__init__()
        self.stop_at = stop_at
        self.epochs_at: list[int] = []

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        if self.trainer.global_step == self.stop_at:
            raise Interrupted
        self.epochs_at.append(self.trainer.current_epoch)
        return super().training_step(batch, index)


@pytest.mark.parametrize(("before", "after"), [((8, 1), (4, 2)), ((4, 2), (8, 1))])
def test_a_lightning_attempt_in_another_split_resumes_at_its_steps_micro_batch_and_epoch_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """Lightning counts an epoch's micro-batches (accumulating up to each multiple of the
    accumulation, ending the epoch at the loader's length) and resumes that count from its
    checkpoint. An attempt in another split (the operator's, after a fallback into fp32 or an
    out-of-memory, or its taking back) read it in the split that wrote it. Before, resumed at step
    5: split 8 x 1 -> 4 x 2, step 5 trained one micro-batch of 4 (half the job's samples) and the
    epoch ran past its 64 steps; 4 x 2 -> 8 x 1, the epoch ended 5 steps early. Now every step
    trains the attempt's micro-batches, and epoch 1 begins at step 64 (512 samples of 8 a step)."""
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 70}, checkpoint={"everySteps": 5})
    for attempt, (micro, accumulation) in enumerate([before, after]):
        launch = in_process_launch(tmp_path, monkeypatch, job, "fp32")
        split = {"attempt": attempt, "microBatch": micro, "gradAccumulation": accumulation}
        launch = AttemptLaunch.model_validate({**launch.model_dump(by_alias=True), **split})
        module = EpochModule(stop_at=6 if attempt == 0 else None)
        if attempt == 0:
            with pytest.raises(Interrupted):
                _lightning(launch, False, 1, module, batch=micro)
        else:
            _lightning(launch, False, 1, module, batch=micro)
    assert module.steps_at == [step for step in range(5, 70) for _ in range(accumulation)]
    assert module.steps_at[module.epochs_at.index(1)] == 64
