"""A fallback made in place after the quality gate's drift (QualityDrift) begins an attempt whose
evaluations in a row count from none, as a restarted attempt's do: one drifting evaluation in
the next precision is recorded, not acted on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from mpjob_contract.launch import InPlaceTarget
from mpjob_contract.report import TerminationReport
from mpjob_trainer import session as mpjob
from tests.unit.trainer.conftest import in_process_launch, spec, train_squares

pytestmark = pytest.mark.unit


def test_the_next_precision_in_place_drifts_twice_in_a_row_before_the_gate_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = spec(
        training={"steps": 12, "batchSize": 4, "logEvery": 2},
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]},
        validation={"everySteps": 2, "maxLossDelta": 0.05},
        checkpoint={"everySteps": 2},
    )
    targets = [InPlaceTarget(precision="bf16"), InPlaceTarget(precision="fp32")]
    launch = in_process_launch(tmp_path, monkeypatch, job, "fp16").model_copy(update={"in_place_to": targets})
    with mpjob.start(launch=launch) as run:
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        start = run.resume(model=model, optimizer=optimizer)
        run.evaluate_with(lambda: 1.5 if run.precision != "fp32" else 1.0)  # every low precision drifts
        train_squares(run, model, optimizer, start, lambda i: torch.ones(4, 4))
    report = TerminationReport.model_validate_json((tmp_path / "report.json").read_text())
    assert report.reason == "Succeeded" and report.precision == "fp32", report.message
    fp16, bf16 = report.precision_changes
    assert (fp16.to_precision, bf16.to_precision) == ("bf16", "fp32")
    # bf16 re-runs the steps from fp16's rollback point, evaluating as it goes: it ends at its own
    # second drifting evaluation in a row (step 4), not at its first on top of fp16's streak (step 2)
    assert bf16.step == fp16.start_step + 2 * 2
