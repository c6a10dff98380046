"""`auto` decided on the node: the trainer times its own step in each precision the device
supports, keeps nothing of the probe, and trains in the fastest that stayed finite (F6)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.report import amp_slower
from mpjob_trainer.session.measure import choose, nothing_kept
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

MLP = {"inputs": 8, "hidden": 16, "samples": 256}


def auto_job(**args: object) -> dict:
    return spec(task={"builtin": "mlp", "args": {**MLP, **args}}, precision={"mode": "auto"}, training={"steps": 12})


@pytest.mark.parametrize(
    ("seconds", "chosen", "slower"),
    [
        ({"bf16": 0.5, "fp32": 1.0}, "bf16", False),
        ({"bf16": 0.97, "fp32": 1.0}, "fp32", True),  # within the 5 % margin: not worth it
        ({"bf16": None, "fp32": 1.0}, "fp32", False),  # bf16 went non-finite: no AMP measured
        ({"bf16": 0.8, "fp16": 0.6, "fp32": 1.0}, "fp16", False),
        ({"bf16": 0.62, "fp16": 0.6, "fp32": 1.0}, "bf16", False),  # fp16 not faster by the margin: bf16, no scaler
        ({"bf16": 0.5, "fp32": None}, "bf16", False),
        # fp8 (cc >= 8.9) must beat bf16 by the margin too: it is the less safe of the two
        ({"fp8": 0.3, "bf16": 0.5, "fp32": 1.0}, "fp8", False),
        ({"fp8": 0.49, "bf16": 0.5, "fp32": 1.0}, "bf16", False),
        ({"fp8": 0.3, "bf16": None, "fp32": 1.0}, "fp8", False),  # bf16 non-finite: fp8 against fp32
        ({"fp8": None, "bf16": 0.5, "fp32": 1.0}, "bf16", False),
        ({"fp8": 0.97, "bf16": 1.2, "fp32": 1.0}, "fp32", True),
    ],
)
def test_the_fastest_finite_low_precision_must_beat_fp32_by_the_margin(
    seconds: dict[str, float | None], chosen: str, slower: bool
) -> None:
    measurement = choose(seconds)
    assert (measurement.chosen, measurement.amp_slower_than_fp32) == (chosen, slower)
    assert amp_slower(chosen, seconds) is slower  # the contract's rule, as the operator reads a scrape


@pytest.mark.process
def test_auto_on_cpu_measures_bf16_and_fp32_and_trains_in_the_one_chosen(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, auto_job(), "auto")
    assert run.code == 0, run.stderr
    (event,) = run.of("precisionMeasured")
    seconds = event["stepSeconds"]
    assert set(seconds) == {"bf16", "fp32"} and all(s > 0 for s in seconds.values())
    assert event["chosen"] == choose(seconds).chosen  # the rule, on what this machine measured
    assert {s["precision"] for s in run.of("step")} == {event["chosen"]}
    report = run.report
    assert report is not None and report.measurement is not None and report.precision == event["chosen"]
    assert report.measurement.step_seconds == seconds


@pytest.mark.parametrize(("slow", "chosen", "slower"), [("fp32", "bf16", False), ("bf16", "fp32", True)])
@pytest.mark.process
def test_a_device_where_one_precision_is_slow_decides_the_choice(
    tmp_path: Path, slow: str, chosen: str, slower: bool
) -> None:
    run = run_trainer(tmp_path, auto_job(stepDelay={slow: 0.3}), "auto")
    assert run.code == 0, run.stderr
    measurement = run.report.measurement if run.report else None
    assert measurement is not None
    assert (measurement.chosen, measurement.amp_slower_than_fp32) == (chosen, slower)
    assert measurement.step_seconds[slow] > 0.3 > measurement.step_seconds[chosen]


@pytest.mark.process
def test_measuring_keeps_nothing_the_run_trains_as_if_it_had_started_in_the_chosen_precision(tmp_path: Path) -> None:
    job = auto_job(stepDelay={"fp32": 0.3})
    measured = run_trainer(tmp_path / "auto", job, "auto")
    plain = run_trainer(tmp_path / "bf16", job, "bf16")
    assert measured.code == plain.code == 0, measured.stderr + plain.stderr
    assert measured.report is not None and measured.report.precision == "bf16"
    a = torch.load(tmp_path / "auto" / "ckpt" / "step-000000012" / "state.pt", weights_only=True)
    b = torch.load(tmp_path / "bf16" / "ckpt" / "step-000000012" / "state.pt", weights_only=True)
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert a["appliedSteps"] == b["appliedSteps"] == 12


def test_measuring_puts_back_the_buffers_a_step_rebinds_as_well_as_those_it_changes_in_place() -> None:
    """A running statistic kept out of place (`self.mean = 0.9 * self.mean + ...`) binds a new
    tensor to the buffer's name: the probe's steps must leave no trace in it either."""
    model = nn.Sequential(nn.BatchNorm1d(2))
    model.register_buffer("mean", torch.zeros(2))
    model[0].register_buffer("seen", torch.zeros((), dtype=torch.long))
    before = {name: (b, b.clone()) for name, b in model.named_buffers()}
    with nothing_kept([model]):
        model(torch.randn(4, 2))  # BatchNorm's statistics, in place
        model.mean = 0.9 * model.mean + 0.1 * torch.ones(2)
        model[0].seen = model[0].seen + 1
    for name, live in model.named_buffers():
        original, value = before[name]
        assert live is original and torch.equal(live, value), name
