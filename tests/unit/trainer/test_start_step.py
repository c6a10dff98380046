"""Where an attempt really began, as the trainer tells it: its start-step gauge reads -1 until the
attempt has decided (a read before that is no fresh start), keeps its value when an `auto`
attempt relabels its series, and the termination report carries it only once it is known."""

from __future__ import annotations

import pytest

from mpjob_contract import metrics as tm
from mpjob_contract.report import TerminationReport
from mpjob_trainer.metrics import TrainerMetrics
from mpjob_trainer.session.ending import Standing, conclude

pytestmark = pytest.mark.unit


def test_the_start_step_gauge_is_undecided_until_set_and_survives_a_relabel() -> None:
    metrics = TrainerMetrics("j", "ns", 1, "auto")
    labels = dict(metrics.labels)
    assert metrics.registry.get_sample_value(tm.START_STEP, labels) == -1
    metrics.start_step.set(20)
    metrics.step.set(20)
    metrics.relabel("bf16")  # an auto attempt measured its device after it resumed
    relabelled = {**labels, "precision": "bf16"}
    assert metrics.registry.get_sample_value(tm.START_STEP, relabelled) == 20
    assert metrics.registry.get_sample_value(tm.STEP, relabelled) == 20
    assert metrics.registry.get_sample_value(tm.START_STEP, labels) is None  # the old series is gone


@pytest.mark.parametrize("started_at", [None, 0, 20])
def test_the_report_says_where_the_attempt_began_only_once_it_knows(tmp_path, monkeypatch, started_at) -> None:
    monkeypatch.setenv("MPJOB_TERMINATION_LOG", str(tmp_path / "report.json"))
    conclude(None, Standing(step=30, start_step=started_at, precision="bf16"), lambda *a, **k: None)
    report = TerminationReport.parse_message((tmp_path / "report.json").read_text())
    assert report is not None and report.start_step == started_at
