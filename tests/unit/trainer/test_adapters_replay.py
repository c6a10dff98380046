"""The framework adapters register the framework's step and evaluation with the session: a
numeric fault under the Hugging Face Trainer or Lightning is replayed in fp32 (bad data ->
NonFiniteInFp32 with guard.onBadData fail, skipped with skip: test_adapters_skipping; a
precision's overflow -> NumericFault), and spec.validation's quality gate evaluates the
framework's eval set in the attempt's precision and in fp32."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from mpjob_contract.codes import ExitCode
from mpjob_trainer.errors import ConfigError
from tests.unit.trainer.conftest import in_process_launch, parse, run_trainer, spec
from tests.unit.trainer.framework_script import logged_steps
from tests.unit.trainer.test_adapters_arguments import Linear, Regression

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))
FRAMEWORKS = ["hf", "lightning"]
#: A sample each framework's data order serves within the run (HF's sampler shuffles by its seed).
POISON = {"hf": "7", "lightning": "100"}


def job(framework: str, *extra: str, on_bad_data: str = "fail", **over: object) -> dict:
    guard = {"maxNonFiniteLosses": 1, "onBadData": on_bad_data}
    return spec(
        task={"command": [sys.executable, SCRIPT, framework, *extra]},
        training={"steps": 30, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3},
        precision={"mode": "fp16", "fallback": [], "guard": guard},
        **over,
    )


@pytest.mark.parametrize(
    ("framework", "extra"),
    [("hf", []), ("hf", ["--loss-func"]), ("lightning", [])],
    ids=["hf", "hf-compute_loss_func", "lightning"],
)
@pytest.mark.process
def test_bad_data_under_a_framework_replays_non_finite_in_fp32(tmp_path: Path, framework: str, extra: list) -> None:
    """Also under a Trainer whose loss is its `compute_loss_func`'s: the replay computes that loss."""
    argv = [SCRIPT, framework, "--poison", POISON[framework], *extra]
    run = run_trainer(tmp_path, job(framework, *argv[2:]), "fp16", argv=argv)
    assert run.code == ExitCode.NON_FINITE_IN_FP32, run.stderr[-3000:]
    replay = run.report.replay if run.report else None
    assert replay is not None and replay.verdict == "data" and replay.ranks == [0]
    assert not replay.from_checkpoint and replay.steps == 1 and replay.offending_step == replay.first_step
    assert run.report is not None and f"step {replay.first_step + 1} is non-finite too" in run.report.message
    assert [e["verdict"] for e in run.of("replay")] == ["data"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_an_fp16_overflow_under_a_framework_replays_finite_in_fp32(tmp_path: Path, framework: str) -> None:
    argv = [SCRIPT, framework, "--overflow-at", "12"]
    run = run_trainer(tmp_path, job(framework, "--overflow-at", "12"), "fp16", argv=argv)
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr[-3000:]
    replay = run.report.replay if run.report else None
    assert replay is not None and replay.verdict == "precision" and replay.first_step >= 12
    assert run.report is not None and "finitely: the precision is at fault" in run.report.message


@pytest.mark.parametrize(
    ("framework", "extra"),
    [("hf", []), ("hf", ["--loss-func"]), ("lightning", [])],
    ids=["hf", "hf-compute_loss_func", "lightning"],
)
@pytest.mark.process
def test_the_quality_gate_evaluates_a_frameworks_eval_set_in_fp32_too(
    tmp_path: Path, framework: str, extra: list
) -> None:
    """Also under a Trainer whose loss is its `compute_loss_func`'s (the model computes none): the gate computes it."""
    validation = {"everySteps": 10, "batches": 2, "maxLossDelta": 0.5}
    argv = [SCRIPT, framework, *extra]
    run = run_trainer(tmp_path, job(framework, *extra, validation=validation), "bf16", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    evals = run.of("eval")
    assert [e["step"] for e in evals] == [10, 20, 30]
    for e in evals:  # bf16 and fp32 at the same weights: close, not equal
        assert e["loss"] != e["lossFp32"] and abs(e["loss"] - e["lossFp32"]) <= 0.05 * e["lossFp32"]


def _lightning_evals(tmp: Path, batches: int, *extra: str) -> list[float]:
    validation = {"everySteps": 10, "batches": batches, "maxLossDelta": 0.5}
    argv = [SCRIPT, "lightning", *extra]
    run = run_trainer(tmp, job("lightning", *extra, validation=validation), "bf16", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    return [e["loss"] for e in run.of("eval")]


@pytest.mark.process
def test_the_lightning_gate_leaves_out_the_batches_validation_step_skips(tmp_path: Path) -> None:
    """A `validation_step` that returns None for a batch skips it, as in Lightning's validation loop:
    of two batches, the gate's loss is the first's alone."""
    skipping = _lightning_evals(tmp_path / "skipping", 2, "--val-output", "odd-none")
    first_only = _lightning_evals(tmp_path / "first", 1)
    assert len(skipping) == 3 and skipping == first_only


@pytest.mark.parametrize(
    ("output", "message"),
    [("none", "validation_step returned no loss"), ("dict", "validation_step returned a dict without 'loss'")],
)
@pytest.mark.process
def test_a_lightning_validation_step_that_returns_no_loss_is_a_config_error(
    tmp_path: Path, output: str, message: str
) -> None:
    validation = {"everySteps": 10, "batches": 2}
    argv = [SCRIPT, "lightning", "--val-output", output]
    run = run_trainer(tmp_path, job("lightning", *argv[2:], validation=validation), "bf16", argv=argv)
    assert run.code == ExitCode.CONFIG_ERROR, run.stderr[-3000:]
    assert run.report is not None and message in run.report.message


@pytest.mark.process
def test_the_lightning_gate_logs_nothing_of_the_modules(tmp_path: Path) -> None:
    """The gate calls `validation_step` from a training hook: a `self.log("val_loss", ...)` there would
    become a training metric of that step (callback_metrics, loggers, a monitor), holding the gate's
    last batch. The module's own training-time logging still lands."""
    validation = {"everySteps": 10, "batches": 2, "maxLossDelta": 0.5}
    argv = [SCRIPT, "lightning", "--log-losses"]
    run = run_trainer(tmp_path, job("lightning", *argv[2:], validation=validation), "bf16", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    assert [e["step"] for e in run.of("eval")] == [10, 20, 30]
    found = re.search(r"^callback metrics: (.*)$", run.stderr, re.M)
    assert found is not None, run.stderr[-3000:]
    assert set(json.loads(found.group(1))) == {"train_loss"}


@pytest.mark.process
def test_the_lightning_replay_logs_nothing_of_the_modules(tmp_path: Path) -> None:
    """The fp32 replay re-runs `training_step` from a training hook, after the faulting step: a
    `self.log("train_loss", ...)` there would log the replay's finite fp32 loss as a metric of the next
    step, which never trains. The loss is logged once for each step the loop trained, and for no other."""
    argv = [SCRIPT, "lightning", "--overflow-at", "12", "--log-losses"]
    run = run_trainer(tmp_path, job("lightning", *argv[2:]), "fp16", argv=argv)
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr[-3000:]
    assert run.report is not None and run.report.replay is not None and run.report.replay.verdict == "precision"
    assert logged_steps(run.stderr, "train_loss") == list(range(run.report.step))  # steps 0 .. the faulting one


class Validated(Linear):
    """`validation_step` returns the loss; no val_dataloader() (its loaders are given to `fit`)."""

    def validation_step(self, batch: Any, index: int, dataloader_idx: int = 0) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)


class TwoLoaders(Validated):
    def val_dataloader(self) -> Any:
        return [_loader(), _loader()]


def _loader() -> torch.utils.data.DataLoader[Any]:
    return torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16)), batch_size=8
    )


def _gated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from mpjob_trainer import session as mpjob

    validation = {"everySteps": 1, "batches": 2}
    job = spec(task={"command": ["python", "train.py"]}, training={"steps": 2, "batchSize": 8}, validation=validation)
    return mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32"))


@pytest.mark.parametrize(
    ("module", "message"),
    [(Validated, "has no val_dataloader()"), (TwoLoaders, "val_dataloader() returns 2 loaders")],
    ids=["val_dataloaders-given-to-fit", "two-val-loaders"],
)
def test_a_lightning_gate_without_one_val_dataloader_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: type[Validated], message: str
) -> None:
    """The gate evaluates `validation_step` on the module's one `val_dataloader()`: loaders given to
    `fit` (Lightning's own validation runs on them), or several (told apart by a `dataloader_idx`),
    are a configuration error that says so, not Lightning's exception or a failed unpacking."""
    import lightning as L

    from mpjob_trainer.adapters import lightning as mpjob_lightning

    run = _gated(tmp_path, monkeypatch)
    try:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False))
        with pytest.raises(ConfigError, match=re.escape(message)):
            mpjob_lightning.fit(run, trainer, module(), train_dataloaders=_loader(), val_dataloaders=_loader())
    finally:
        run.close()


class TwoOptimizersValidated(Validated):
    """Manual optimization stepping two optimizers (a GAN's shape): no one step to replay, yet its
    own `val_dataloader()` is there for the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)
        self.manual_backward(loss)
        for optimizer in self.optimizers():
            optimizer.step()
            optimizer.zero_grad()
        return loss

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:  # type: ignore[override]
        return [torch.optim.SGD([self.linear.weight], lr=0.1), torch.optim.SGD([self.linear.bias], lr=0.1)]

    def val_dataloader(self) -> Any:
        return _loader()


def test_the_lightning_gate_evaluates_a_module_stepping_several_optimizers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Several optimizers give the replay no one step to re-run, but the gate needs none: it
    evaluates `validation_step` at every validation.everySteps as for any module, rather than
    leaving spec.validation silently unchecked."""
    import lightning as L

    from mpjob_trainer.adapters import lightning as mpjob_lightning

    run = _gated(tmp_path, monkeypatch)
    try:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False, enable_model_summary=False))
        mpjob_lightning.fit(run, trainer, TwoOptimizersValidated(), train_dataloaders=_loader())
    finally:
        run.close()
    evals = [e for e in parse(capfd.readouterr().out) if e["event"] == "eval"]
    assert [e["step"] for e in evals] == [2]  # the one batch: Lightning's global step counts both optimizers' steps


def test_a_hf_gate_with_a_dict_of_eval_sets_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer takes several eval sets as a dict; the gate evaluates one, and says so."""
    from transformers import Trainer

    from mpjob_trainer.adapters import hf as mpjob_hf

    data = [{"x": x, "labels": y} for x, y in zip(torch.randn(16, 4), torch.randn(16), strict=True)]
    run = _gated(tmp_path, monkeypatch)
    try:
        args = mpjob_hf.training_arguments(run)
        trainer = Trainer(model=Regression(), args=args, train_dataset=data, eval_dataset={"a": data, "b": data})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=re.escape("eval_dataset is a dict of eval sets (a, b)")):
            mpjob_hf.train(run, trainer)
    finally:
        run.close()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_a_suspect_replayed_under_a_framework_is_not_replayed_again_after_the_loop_re_enters(
    tmp_path: Path, framework: str
) -> None:
    """One non-finite loss by the read at 15 is a suspect (replayed, the precision's: the loop re-enters
    from its checkpoint); the guard's fault at 20 on the same steps is judged by that replay."""
    argv = [SCRIPT, framework, "--overflow-at", "14"]
    skipping = {**job(framework, *argv[2:]), "precision": {"mode": "fp16", "fallback": []}}  # the default guard
    run = run_trainer(tmp_path, skipping, "fp16", argv=argv)
    assert run.code == ExitCode.NUMERIC_FAULT, run.stderr[-3000:]
    (replay,) = run.of("replay")
    assert (replay["verdict"], replay["firstStep"]) == ("precision", 14)
    assert run.report is not None and "finitely: the precision is at fault" in run.report.message
