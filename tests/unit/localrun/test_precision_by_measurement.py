"""`mpjob run` with precision by measurement: `auto` measured on this machine (two workers
agree on it), with the condition and the figures in report.json."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.localrun.test_smarter_fallback import mlp, run

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_two_workers_measure_auto_alike_and_the_report_shows_amp_slower(tmp_path: Path) -> None:
    code, report, out = run(
        tmp_path, workers=2, task=mlp(samples=256, stepDelay={"bf16": 0.3}), precision={"mode": "auto"}
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    (only,) = report["attempts"]
    assert (only["precision"], only["worldSize"]) == ("fp32", 2) and report["precision"] == "fp32"
    assert only["measuredStepSeconds"]["bf16"] > 0.3 > only["measuredStepSeconds"]["fp32"]
    slower = next(c for c in report["conditions"] if c["type"] == "AmpSlowerThanFp32")
    assert slower["status"] == "True" and "training in fp32" in slower["message"]
    warned = [n for n, line in enumerate(out.splitlines()) if line.startswith("warning: no low precision beat fp32")]
    assert len(warned) == 1, out  # said once, as soon as the workers measured, before the run's end
    assert warned[0] < min(n for n, line in enumerate(out.splitlines()) if "Succeeded" in line), out
    assert "attempt 0 (fp32) ended: Succeeded" in out and "(auto) ended" not in out, out  # as it trained
