"""bench/fp8_rows.py without a GPU: which rows it runs, at which shapes, and the ratio it prints
(the trainer runs are faked here; test_bench_trainer_gpu runs the real ones with --tiny)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from bench import fp8_rows
from bench.gpu_setup import Setup
from bench.gpu_trainer import job_spec
from bench.trainer_gpu import TINY

pytestmark = pytest.mark.unit


@dataclass
class Fake:
    tokens_per_s: float


def test_on_a_cpu_fp8_runs_emulated_at_the_base_and_the_larger_shape(capsys: pytest.CaptureFixture[str]) -> None:
    setup = Setup(args=TINY, batch=4, steps=40, compile="never")
    ran: list[tuple[Any, str, bool]] = []

    def run(s: Setup, label: str, profile: bool) -> tuple[Fake, dict[str, Any] | None]:
        ran.append((s.args, label, profile))
        unwritten = {"precision": label, "unavailable": "Failed: too large"}
        return Fake(300.0 if label == "fp8" else 200.0), unwritten if profile else None

    out = fp8_rows.fp8_rows(setup, tiny=True, run=run, show=lambda label, f: None)
    # both rows at the larger shape are profiled, the row at the benchmark's shape is not
    assert ran == [(fp8_rows.LARGE_TINY, "bf16", True), (fp8_rows.LARGE_TINY, "fp8", True), (TINY, "fp8", False)]
    assert out["skipped"] is None and set(out["large"]) == set(out["largeProfiles"]) == {"bf16", "fp8"}
    printed = capsys.readouterr().out
    assert "fp8 / bf16 tokens/s at the larger shape: 1.50x (target >= 1.25x" in printed
    assert "profile of fp8 steps: none written (Failed: too large)" in printed
    spec = job_spec(setup, "fp8", steps=10, log_every=5)
    assert spec["precision"]["mode"] == "fp8" and spec["precision"]["fp8"] == {"recipe": "tensorwise", "emulate": True}


def test_the_larger_shape_is_a_billion_parameters_at_sequence_2048() -> None:
    large = fp8_rows.large_setup(Setup(args=TINY, batch=16, steps=240, compile="always"), tiny=False)
    args = large.args
    params = args["nLayer"] * 12 * args["nEmbd"] ** 2 + 2 * args["vocabSize"] * args["nEmbd"]
    assert args["blockSize"] == 2048 and 1.0e9 <= params <= 1.2e9 and large.batch == fp8_rows.LARGE_BATCH


def test_without_fp8_rows_the_ratio_says_so() -> None:
    assert fp8_rows.ratio_line({"bf16": Fake(1.0)}).endswith("n/a (no fp8 row)")
