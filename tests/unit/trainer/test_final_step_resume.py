"""A crash after the final checkpoint (the process reported Succeeded, then died at exit) is
retried; the retry resumes at the last step and must end Succeeded at once: no step past
training.steps, no new checkpoint, the same final weights. For the builtin loop, a loop on
the SDK and both framework adapters."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.unit.trainer.adapter_jobs import command as adapter_command
from tests.unit.trainer.adapter_jobs import job as adapter_job
from tests.unit.trainer.conftest import in_process_launch, run_trainer, spec

pytestmark = pytest.mark.unit

STEPS = 20
SDK_SCRIPT = Path(__file__).with_name("sdk_script.py")
SETTINGS = {"training": {"steps": STEPS, "logEvery": 5}, "checkpoint": {"everySteps": 10, "keep": 5}}


def job_of(loop: str) -> tuple[dict, list[str] | None]:
    """The job and the argv (None: the builtin trainer) of each kind of loop."""
    if loop == "builtin":
        return spec(**SETTINGS), None
    if loop == "sdk":
        return spec(task={"command": ["python", str(SDK_SCRIPT)]}, **SETTINGS), [str(SDK_SCRIPT)]
    return adapter_job(loop, training={"steps": STEPS}, checkpoint={"everySteps": 10, "keep": 5}), adapter_command(
        loop
    )[1:]


def fingerprint(ckpt: Path) -> dict[str, str]:
    """Every file of every checkpoint, by sha256: what a resumed attempt may not change."""
    return {
        str(p.relative_to(ckpt)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(ckpt.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


@pytest.mark.parametrize("loop", ["builtin", "sdk", "hf", "lightning"])
@pytest.mark.process
def test_an_attempt_resumed_at_the_last_step_succeeds_at_once(tmp_path: Path, loop: str) -> None:
    job, argv = job_of(loop)
    ckpt = tmp_path / "ckpt"
    first = run_trainer(tmp_path / "a0", job, "fp32", argv=argv, ckpt=ckpt, timeout=300)
    assert first.code == 0, first.stderr[-3000:]
    assert first.report is not None and first.report.step == STEPS
    assert first.report.last_good_checkpoint is not None and first.report.last_good_checkpoint.step == STEPS
    before = fingerprint(ckpt)

    again = run_trainer(tmp_path / "a1", job, "fp32", argv=argv, ckpt=ckpt, attempt=1, timeout=300)
    assert again.code == 0, again.stderr[-3000:]
    report = again.report
    assert report is not None and report.reason == "Succeeded", report
    assert (report.start_step, report.step) == (STEPS, STEPS), report
    assert report.message == f"trained {STEPS} steps in fp32"
    assert report.last_good_checkpoint == first.report.last_good_checkpoint
    assert not again.of("step"), again.of("step")  # nothing trained
    assert fingerprint(ckpt) == before  # no new checkpoint, the final weights untouched


def test_the_hf_adapter_resumed_at_the_last_step_returns_a_train_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mpjob_hf.train` returns what `Trainer.train` returns, also when nothing is left to train: a
    script that reads its result (`train(...).metrics`, as the Trainer's own examples do) must not
    fail the retry that resumes at the last step."""
    from transformers import Trainer

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import hf as mpjob_hf
    from tests.unit.trainer.test_adapters_arguments import Regression

    data = [{"x": x, "labels": y} for x, y in zip(torch.randn(16, 4), torch.randn(16), strict=True)]
    training, checkpoint = {"steps": 2, "batchSize": 8}, {"everySteps": 10}
    job = spec(task={"command": ["python", "train.py"]}, training=training, checkpoint=checkpoint)
    outputs = []
    for _ in range(2):  # the run, then its retry from the final checkpoint
        with mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32")) as run:
            trainer = Trainer(model=Regression(), args=mpjob_hf.training_arguments(run), train_dataset=data)  # type: ignore[arg-type]
            outputs.append(mpjob_hf.train(run, trainer))
    trained, retried = outputs
    assert trained.global_step == retried.global_step == 2
    assert isinstance(retried.metrics, dict) and isinstance(retried.training_loss, float)


def _trained(framework: str, run: Any) -> torch.nn.Module:
    """The model after the adapter's train / fit on a small regression (the same data every time)."""
    import lightning as L
    from transformers import Trainer

    from mpjob_trainer.adapters import hf as mpjob_hf
    from mpjob_trainer.adapters import lightning as mpjob_lightning
    from tests.unit.trainer.test_adapters_arguments import Linear, Regression

    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 4, generator=generator), torch.randn(16, generator=generator)
    if framework == "hf":
        data = [{"x": x[i], "labels": y[i]} for i in range(16)]
        model: torch.nn.Module = Regression()
        mpjob_hf.train(run, Trainer(model=model, args=mpjob_hf.training_arguments(run), train_dataset=data))  # type: ignore[arg-type]
        return model
    module = Linear()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    mpjob_lightning.fit(
        run, L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False)), module, train_dataloaders=loader
    )
    return module


@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_retry_at_the_last_step_leaves_the_trained_weights_in_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    """A script may save, export or evaluate its model once train / fit returns: on the retry that
    resumes at the last step (nothing left to train) the model holds the trained weights of the final
    checkpoint, not the ones it was built with."""
    from mpjob_trainer import session as mpjob

    training, checkpoint = {"steps": 2, "batchSize": 8, "learningRate": 0.1}, {"everySteps": 10}
    job = spec(task={"command": ["python", "train.py"]}, training=training, checkpoint=checkpoint)
    finals = []
    for _ in range(2):  # the run, then its retry from the final checkpoint
        with mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "fp32")) as run:
            finals.append({k: v.detach().clone() for k, v in _trained(framework, run).state_dict().items()})
    trained, retried = finals
    assert trained.keys() == retried.keys() and all(torch.equal(trained[k], retried[k]) for k in trained)
