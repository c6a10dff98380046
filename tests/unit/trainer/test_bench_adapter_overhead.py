"""bench/adapter_overhead.py's loops run to their last step on the adapters: the Lightning script's
job says the micro-batch its loader gives (256), which the session refused as a ConfigError (exit
43) when the job said the HF script's 16."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import adapter_overhead

pytestmark = pytest.mark.unit


def test_the_lightning_script_trains_every_step_on_the_adapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPJOB_METRICS_PORT", "off")
    monkeypatch.setenv("MPJOB_TERMINATION_LOG", str(tmp_path / "report.json"))
    ticks: list[int] = []
    adapter_overhead.lightning_mpjob(lambda: ticks.append(1), tmp_path)
    assert len(ticks) == adapter_overhead.STEPS
