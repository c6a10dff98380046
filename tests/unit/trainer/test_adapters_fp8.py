"""fp8 attempts under the framework adapters (torchao float8 linears, emulated on the CPU): the
session converts the eligible linears, and the framework runs the rest of the model under bf16
autocast (adapters.mixed), as the builtin loop does; the attempt trains as a bf16 one does."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mpjob_trainer.adapters.mixed import framework_precision
from tests.unit.trainer.conftest import Run, run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))
FRAMEWORKS = ["hf", "lightning"]
#: Where each framework's module keeps the script's model.
PREFIX = {"hf": "", "lightning": "net."}


def test_an_fp8_attempt_is_bf16_to_a_framework() -> None:
    assert {p: framework_precision(p) for p in ("fp8", "fp16", "bf16", "fp32")} == {
        "fp8": "bf16",
        "fp16": "fp16",
        "bf16": "bf16",
        "fp32": "fp32",
    }


def attempt(tmp_path: Path, framework: str, precision: str) -> Run:
    job = spec(
        task={"command": [sys.executable, SCRIPT, framework, "--deep"]},
        training={"steps": 80, "batchSize": 16, "logEvery": 10, "seed": 0, "learningRate": 1e-2},
        precision={"mode": precision, "fallback": [], "fp8": {"emulate": True}},
    )
    return run_trainer(tmp_path, job, precision, argv=[SCRIPT, framework, "--deep"])


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_an_fp8_attempt_under_a_framework_trains_float8_linears_in_bf16_autocast(
    tmp_path: Path, framework: str
) -> None:
    run = attempt(tmp_path, framework, "fp8")
    assert run.code == 0, run.stderr[-3000:]
    (converted,) = run.of("fp8")
    at = PREFIX[framework]
    assert converted["converted"] == [f"{at}mid.0"]
    assert converted["kept"] == {f"{at}inp": "first linear", f"{at}out": "last linear"}
    assert "activation dtype: bfloat16" in run.stderr  # the kept first linear ran under bf16 autocast
    assert run.report is not None and run.report.precision == "fp8" and run.report.step == 80
    bf16 = attempt(tmp_path / "bf16", framework, "bf16")
    assert bf16.code == 0, bf16.stderr[-3000:]
    losses, reference = [s["loss"] for s in run.of("step")], [s["loss"] for s in bf16.of("step")]
    assert len(losses) == len(reference) == 8
    assert max(abs(a - b) for a, b in zip(losses, reference, strict=True)) < 0.05  # fp8's error is small here
