"""`mpjob run` of a team's own loop on the SDK (team_script.py): streaming data, BatchNorm,
OneCycleLR, an EMA copy and its own evaluation, through a fallback fp16 -> bf16."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from tests import warm
from tests.helpers import NO_PLOT, mpjob_run_json, run_to_end

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).with_name("team_script.py")


def manifest(name: str, args: dict[str, int], *flags: str) -> dict[str, Any]:
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": name},
        "spec": {
            "task": {"command": [sys.executable, str(SCRIPT), *flags], "args": args},
            "training": {"steps": 40, "logEvery": 5, "seed": 0},
            "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
            "checkpoint": {"everySteps": 10},
            "resources": {"gpusPerWorker": 0},
        },
    }


def lines(out: Path, attempt: int, kind: str) -> dict[int, str]:
    """The script's own `kind` lines of an attempt, by step."""
    text = (out / "attempts" / f"a{attempt}" / "worker0.log").read_text()
    return {int(m[1]): m[0] for m in re.finditer(rf"^{kind} step=(\d+) .*$", text, re.M)}


@pytest.mark.process
def test_streaming_data_schedule_ema_and_own_evaluation_go_on_where_the_checkpoint_stood(tmp_path: Path) -> None:
    _, report, out = mpjob_run_json(tmp_path, manifest("team", {"overflowAt": 25}))
    ends = [(a["precision"], a["reason"], a["startStep"]) for a in report["attempts"]]
    assert ends == [("fp16", "NumericFault", 0), ("bf16", "Succeeded", 20)]
    first, second = lines(out, 0, "DATA"), lines(out, 1, "DATA")
    assert min(second) == 21 and second[21] == first[21]  # the next unseen samples, none repeated or skipped
    evals = lines(out, 0, "EVAL"), lines(out, 1, "EVAL")
    assert sorted(evals[1]) == [25, 30, 35, 40]
    # OneCycleLR's rate and the EMA's count at step 25 are the fp16 attempt's (both restored), and
    # the EMA's evaluation goes on from its value (bf16 against fp16 forward passes since step 20).
    fp16, bf16 = evals[0][25].split(), evals[1][25].split()
    assert fp16[3:] == bf16[3:]
    assert abs(float(fp16[2].split("=")[1]) - float(bf16[2].split("=")[1])) < 1e-3


@pytest.mark.process
def test_a_forward_overflow_that_poisons_batchnorm_statistics_is_never_checkpointed_as_good(tmp_path: Path) -> None:
    """One fp16 forward overflow (step 14) leaves BatchNorm's running statistics (and the EMA's)
    NaN for good while GradScaler keeps the weights finite. Before, every later checkpoint held
    them and the job ended Succeeded in fp16 on a model whose evaluation is NaN; then the fp16
    attempt trained on from poison to its last step (40). The precision ends at the first
    checkpoint that finds them (step 20), with no extra sync per step."""
    _, report, out = mpjob_run_json(tmp_path, manifest("team", {"overflowAt": 13, "overflowUntil": 14}))
    ends = [(a["precision"], a["reason"], a["startStep"]) for a in report["attempts"]]
    assert ends == [("fp16", "NumericFault", 0), ("bf16", "Succeeded", 10)]
    assert "buffers are non-finite at step 20" in report["attempts"][0]["message"]
    assert max(lines(out, 0, "DATA")) == 20  # not one step trained past the checkpoint that found them
    state = torch.load(out / "checkpoints" / "step-000000040" / "state.pt", weights_only=True)
    for name in ("model", "ema"):
        assert all(torch.isfinite(t).all() for t in state[name].values() if t.is_floating_point()), name
    assert "nan" not in " ".join(lines(out, 1, "EVAL").values())


@pytest.mark.process
def test_a_scripts_own_autocast_is_told_at_its_first_forward_instead_of_spending_the_ladder(tmp_path: Path) -> None:
    """Its own torch.autocast(fp16) and GradScaler: before, bf16 and fp32 overflowed in fp16 too
    and the job failed NoPrecisionLeft with nothing naming the script's autocast; then it was told
    only at the fallback, after the fp16 rung was spent on its overflow. Of the attempt's own dtype
    outside run.autocast(), it is told at the first forward, before any step."""
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "job.yaml").write_text(yaml.safe_dump(manifest("own", {"overflowAt": 25}, "--own-amp")))
    out = folder / "out"
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(folder / "job.yaml"), "--out", str(out), "--json", *NO_PLOT]
    run_to_end(argv, out, 300, env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}))
    report = json.loads((out / "report.json").read_text())
    ends = [(a["precision"], a["reason"]) for a in report["attempts"]]
    assert ends == [("fp16", "ConfigError")]
    message = report["attempts"][0]["message"]
    assert "autocast of torch.float16 the script entered itself, not run.autocast()" in message
    assert "GradScaler" in message and list(lines(out, 0, "DATA")) == [1]  # at the first forward
