"""A step that spikes again after its samples were quarantined for a spike: the loop does not
leave quarantined samples out (its re-run is the same step on the same samples, and spikes the
same), so skipping cannot help. The attempt ends at once naming why, as a step non-finite in fp32
again does, rather than rolling back over and over and recording the one step as several skipped
steps until guard.maxSkippedSteps, a message that blames the data or the model."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch

from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import spec, train_linear

pytestmark = pytest.mark.unit

JOB = spec(
    training={"steps": 20, "batchSize": 4, "logEvery": 1},
    precision={"mode": "fp32", "guard": {"spike": {"action": "rollback", "zScore": 6.0, "window": 8}}},
    checkpoint={"everySteps": 2},
)
SPIKE = 12  # a step index past the window's first 8 accepted losses


def test_a_step_spiking_again_after_it_was_skipped_ends_the_attempt_naming_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def inputs(run: mpjob.Session, i: int) -> torch.Tensor:
        x = torch.randn(4, 4, generator=torch.Generator().manual_seed(i))
        return x * 1000.0 if i == SPIKE else x  # served whether quarantined or not: the loop ignores it

    with contextlib.suppress(SystemExit):  # the attempt's ending leaves the session as a trainer's exit
        train_linear(tmp_path, monkeypatch, JOB, "fp32", inputs)
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "NonFiniteInFp32", report.message
    assert "does not leave quarantined samples out" in (report.message or ""), report.message
    assert report.skipped is not None and [(s.step, s.cause) for s in report.skipped.steps] == [(SPIKE, "spike")]
