"""`auto` under Lightning is measured as under the builtin loop: at the first batch the
session times Lightning's own training step in each precision the device supports, keeps
nothing of it, and the precision plugin (SessionAutocast) trains in the one chosen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from mpjob_trainer.session.measure import choose
from tests.unit.trainer.conftest import parse, run_trainer, spec
from tests.unit.trainer.framework_script import logged_steps

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))
STEPS = 20


def auto_job(*extra: str) -> dict:
    return spec(
        task={"command": [sys.executable, SCRIPT, "lightning", *extra]},
        training={"steps": STEPS, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3},
        precision={"mode": "auto"},
    )


@pytest.mark.parametrize(("slow", "chosen", "slower"), [("fp32", "bf16", False), ("bf16", "fp32", True)])
@pytest.mark.process
def test_an_auto_attempt_under_lightning_measures_its_step_and_trains_in_the_chosen_precision(
    tmp_path: Path, slow: str, chosen: str, slower: bool
) -> None:
    argv = [SCRIPT, "lightning", "--slow", slow]
    run = run_trainer(tmp_path, auto_job("--slow", slow), "auto", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    (event,) = run.of("precisionMeasured")
    seconds = event["stepSeconds"]
    assert set(seconds) == {"bf16", "fp32"}
    assert seconds[slow] > 0.3 > seconds[chosen]  # Lightning's own step, under each candidate
    assert (event["chosen"], event["ampSlowerThanFp32"]) == (chosen, slower) == (choose(seconds).chosen, slower)
    assert {s["precision"] for s in run.of("step")} == {chosen}
    (done,) = run.of("done")
    assert done["step"] == STEPS and done["appliedSteps"] == STEPS  # the probe applied no update
    report = run.report
    assert report is not None and report.precision == chosen and report.measurement is not None
    assert report.measurement.step_seconds == seconds and report.measurement.chosen == chosen


@pytest.mark.parametrize(("slow", "chosen"), [("fp32", "bf16"), ("bf16", "fp32")])
@pytest.mark.process
def test_measuring_under_lightning_keeps_nothing_it_trains_as_if_started_in_the_chosen_precision(
    tmp_path: Path, slow: str, chosen: str
) -> None:
    argv = [SCRIPT, "lightning", "--slow", slow]
    measured = run_trainer(tmp_path / "auto", auto_job("--slow", slow), "auto", argv=argv)
    plain = run_trainer(tmp_path / chosen, auto_job("--slow", slow), chosen, argv=argv)
    assert measured.code == plain.code == 0, measured.stderr[-3000:] + plain.stderr[-3000:]
    assert measured.report is not None and measured.report.precision == chosen
    assert [s["loss"] for s in measured.of("step")] == [s["loss"] for s in plain.of("step")]
    framework = Path("ckpt", f"step-{STEPS:09d}", "framework", "lightning.ckpt")
    a = torch.load(tmp_path / "auto" / framework, weights_only=False)["state_dict"]
    b = torch.load(tmp_path / chosen / framework, weights_only=False)["state_dict"]
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.process
def test_measuring_under_lightning_logs_nothing_of_the_modules(tmp_path: Path) -> None:
    """The probes run `training_step` from a training hook at the first batch: a `self.log("train_loss",
    ...)` there would log each probe's loss as a metric of step 0. Each step's loss is logged once, by
    Lightning's loop."""
    argv = [SCRIPT, "lightning", "--log-losses"]
    run = run_trainer(tmp_path, auto_job("--log-losses"), "auto", argv=argv)
    assert run.code == 0, run.stderr[-3000:]
    assert len(run.of("precisionMeasured")) == 1
    assert logged_steps(run.stderr, "train_loss") == list(range(STEPS))


def test_an_auto_attempt_of_a_manually_optimized_module_trains_in_the_devices_default_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A module that optimizes by hand runs backward and steps in its own `training_step`: the
    session cannot run that step for a probe (whose `run.step()` applies nothing) nor for the
    replay. No step is registered, and the attempt trains in the device's default precision (bf16
    on a CPU), as under HF, instead of crashing in the probe (a backward through a freed graph,
    after an update the probe applied): a failure of no known kind, retried in `auto` again."""
    import lightning as L

    from mpjob_trainer import session as mpjob
    from mpjob_trainer.adapters import lightning as mpjob_lightning
    from tests.unit.trainer.conftest import in_process_launch
    from tests.unit.trainer.test_adapters_arguments import ManualLinear

    data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32))
    training = {"steps": 4, "batchSize": 8, "logEvery": 1, "gradClipNorm": 0}
    job = spec(task={"command": ["python", "train.py"]}, training=training, precision={"mode": "auto"})
    run = mpjob.start(launch=in_process_launch(tmp_path, monkeypatch, job, "auto"))
    try:
        trainer = L.Trainer(**mpjob_lightning.trainer_settings(run, logger=False, enable_model_summary=False))
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        mpjob_lightning.fit(run, trainer, ManualLinear(), train_dataloaders=loader)
    finally:
        run.close()
    events = parse(capfd.readouterr().out)
    steps = [e for e in events if e["event"] == "step"]
    assert [(s["step"], s["appliedSteps"], s["precision"]) for s in steps] == [(i, i, "bf16") for i in range(1, 5)]
    assert not [e for e in events if e["event"] == "precisionMeasured"]
