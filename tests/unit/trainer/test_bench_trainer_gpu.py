"""bench/trainer_gpu.py --tiny: the GPU benchmark's code paths (the trainer as the pod runs it
beside nanoGPT's loop in every precision, the in-process guard A/B, the checkpoint stall from
checkpointStaged events, the sync count) run to the end and print every figure. No timing is
asserted: on a shared CPU the figures are noise; what can break is the bench itself."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import warm

pytestmark = [pytest.mark.unit, pytest.mark.process]
REPO = Path(__file__).resolve().parents[3]
LABELS = ("fp32", "fp32+TF32", "fp16", "bf16")
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    figures = tmp_path_factory.mktemp("bench") / "figures.json"
    # One thread a process, as scripts/bench.sh's CPU benchmarks: two busy cores are shared. The
    # trainer processes the bench starts (`python -m mpjob_trainer`) start warm too.
    env = warm.for_ranks({**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MPJOB_METRICS_PORT": "off"})
    proc = warm.run(
        [sys.executable, "bench/trainer_gpu.py", "--tiny", "--json", str(figures)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(figures.read_text())


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_the_header_names_the_device_and_the_torch_version(tiny: Any) -> None:
    proc, _ = tiny
    first = proc.stdout.splitlines()[0]
    assert first.startswith("device: ") and f"torch {torch.__version__}" in first


def test_every_precision_has_a_row_for_both_loops_with_positive_finite_figures(tiny: Any) -> None:
    proc, figures = tiny
    for label in LABELS:
        for side in ("nanoGPT", "mpjob"):
            assert re.search(rf"^{re.escape(label)}\s+{side}\s+(compiled|eager)\s+[\d,]+ tok/s", proc.stdout, re.M), (
                label,
                side,
            )
            row = figures["precisions"][label][side]
            assert positive(row["tokens_per_s"]) and positive(row["step_s"])
            if CUDA:
                assert positive(row["peak_bytes"])
            else:
                assert row["mfu"] is None and row["peak_bytes"] is None
        assert positive(figures["ratios"][label])


def test_both_loops_run_compiled_and_the_trainer_says_it_compiled(tiny: Any) -> None:
    """The trainer's row shows its own `compile` event, not what the bench asked for."""
    proc, figures = tiny
    assert "compile: trainer training.compile=always; nanoGPT loop torch.compile" in proc.stdout
    for label in LABELS:
        assert figures["precisions"][label]["mpjob"]["compiled"] is True
        assert figures["precisions"][label]["nanoGPT"]["compiled"] is True


def test_the_guard_ab_and_the_checkpoint_stall_are_measured(tiny: Any) -> None:
    proc, figures = tiny
    guard = figures["guard"]
    assert re.search(r"^guard A/B \(bf16, 2 interleaved pairs .*overhead [+-][\d.]+ % of step time$", proc.stdout, re.M)
    assert len(guard["runs"]["A"]) == len(guard["runs"]["B"]) == guard["pairs"] == 2
    assert positive(guard["guardOnSeconds"]) and positive(guard["guardOffSeconds"])
    assert math.isfinite(guard["overheadPercent"])
    stall = figures["checkpointStall"]
    assert re.search(r"^checkpoint stall \(bf16, everySteps 20\): 1 save\(s\) staged", proc.stdout, re.M)
    assert stall["saves"] == 1 and stall["stallSeconds"] >= 0 and math.isfinite(stall["percent"])


def test_cuda_only_figures_say_so_on_the_cpu_and_every_target_is_printed(tiny: Any) -> None:
    proc, figures = tiny
    syncs = re.search(r"^host syncs per step \(set_sync_debug_mode\): (.*)$", proc.stdout, re.M)
    assert syncs is not None
    if CUDA:
        assert all(count is not None and count >= 0 for count in figures["syncsPerStep"].values())
    else:
        assert syncs.group(1) == "n/a (no CUDA)"
        assert all(count is None for count in figures["syncsPerStep"].values())
    for target in (">= 50 %", ">= 0.95", ">= 6x", "<= 0.5 %", "<= 1 % at everySteps 200", "0 / <= 1"):
        assert re.search(rf"target {re.escape(target)}$", proc.stdout, re.M), target
    assert len(figures["targets"]) == 6


def test_the_fp8_rows_run_beside_bf16_at_the_larger_shape(tiny: Any) -> None:
    proc, figures = tiny
    for label in ("fp8", "bf16 @L", "fp8 @L"):
        assert re.search(rf"^{re.escape(label)}\s+mpjob\s+(compiled|eager)\s+[\d,]+ tok/s", proc.stdout, re.M), label
    assert "fp8 / bf16 tokens/s at the larger shape: " in proc.stdout
    fp8 = figures["fp8"]
    assert fp8["skipped"] is None and positive(fp8["fp8"]["tokens_per_s"])
    assert all(positive(fp8["large"][p]["tokens_per_s"]) for p in ("bf16", "fp8"))


def test_the_bf16_step_and_both_rows_at_the_larger_shape_are_profiled_by_the_trainer_itself(tiny: Any) -> None:
    """Each profile is the trace the trainer wrote when asked on its metrics port, of steps past
    the measured windows; the run was stopped once it was written."""
    proc, figures = tiny
    profiles = [figures["profile"], *figures["fp8"]["largeProfiles"].values()]
    assert [p["precision"] for p in profiles] == ["bf16", "bf16", "fp8"]
    for profile in profiles:
        assert "unavailable" not in profile, profile
        assert profile["steps"] == 10 and positive(profile["busySecondsPerStep"])
        assert sum(profile["byKind"].values()) == pytest.approx(1.0) and 0 < profile["lowPrecisionShare"] <= 1
        assert positive(profile["capturedStepSeconds"])
    assert re.search(r"^profile of 10 fp8 steps, ", proc.stdout, re.M)
