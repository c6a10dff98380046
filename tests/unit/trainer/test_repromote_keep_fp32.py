"""An fp32 attempt that re-promotes in place (launch.promoteInPlaceTo) trains on in bf16 in the
model it set up in fp32: its keepFp32 modules run in fp32 there as the restarted bf16 attempt's
do, and the run ends with the restart path's weights, bit for bit."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import AttemptLaunch, InPlaceTarget
from mpjob_trainer import session as mpjob
from mpjob_trainer.precision import kept_in_fp32
from tests.unit.trainer.conftest import in_process_launch, spec, train_squares

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 8, "batchSize": 4, "logEvery": 4},
    precision={"mode": "bf16", "fallback": ["fp32"], "repromoteAfterSteps": 4, "keepFp32": ["LayerNorm"]},
    checkpoint={"everySteps": 4},
)


def train(launch: AttemptLaunch, *, repromotes: bool = False) -> tuple[str, bool]:
    """Train the attempt to its end (`repromotes`: its Repromote exit); its precision then, and
    whether the LayerNorm runs in fp32."""
    ends = pytest.raises(SystemExit) if repromotes else contextlib.nullcontext()
    with ends, mpjob.start(launch=launch) as run:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 1))
        run.keep_fp32(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        start = run.resume(model=model, optimizer=optimizer)
        train_squares(
            run, model, optimizer, start, lambda i: torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) * 3
        )
    return run.precision, kept_in_fp32(model[1])


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt / "step-000000008" / "state.pt", weights_only=True)["model"]


def test_an_fp32_attempt_repromoted_in_place_keeps_its_fp32_modules_as_a_restart_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp32 = in_process_launch(tmp_path, monkeypatch, JOB, "fp32").model_copy(update={"repromote_after_steps": 4})
    promote = InPlaceTarget(precision="bf16")
    in_place = fp32.model_copy(update={"checkpoint_dir": str(tmp_path / "inplace"), "promote_in_place_to": promote})
    assert train(in_place) == ("bf16", True)

    restart = fp32.model_copy(update={"checkpoint_dir": str(tmp_path / "restart")})
    assert train(restart, repromotes=True) == ("fp32", False)  # the operator starts bf16 from its checkpoint
    resumed = restart.model_copy(update={"attempt": 1, "precision": "bf16", "repromote_after_steps": None})
    assert train(resumed) == ("bf16", True)
    ours, theirs = weights(tmp_path / "inplace"), weights(tmp_path / "restart")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
