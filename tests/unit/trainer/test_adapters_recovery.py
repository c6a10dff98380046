"""Hugging Face Trainer and Lightning scripts through `mpjob run`: a model that genuinely
overflows in fp16 ends NumericFault in fp16, and the next attempt resumes in bf16 from the
framework checkpoint the first attempt's report names, and succeeds (a restart: the adapters
cannot change precision in place, and the first attempt's message says why). Both frameworks refuse
fp16 on a CPU by themselves (transformers trains fp32 silently, Lightning switches to bf16);
the adapters run torch's CPU fp16 autocast with the attempt's GradScaler, so this runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mpjob_contract.report import TerminationReport
from tests.helpers import mpjob_run_json
from tests.unit.trainer.adapter_jobs import FRAMEWORKS, WEIGHTS, job

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_fp16_overflow_falls_back_to_bf16_from_the_framework_checkpoint(tmp_path: Path, framework: str) -> None:
    spec = job(
        framework,
        "--overflow-at",
        "25",
        training={"steps": 40},
        precision={"mode": "fp16", "fallback": ["bf16", "fp32"]},
        resources={"gpusPerWorker": 0},
    )
    manifest = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": framework}}
    events, report, out = mpjob_run_json(tmp_path, {**manifest, "spec": spec}, timeout=240, frameworks=True)

    first, second = report["attempts"]
    assert (first["precision"], first["reason"], first["exitCode"]) == ("fp16", "NumericFault", 42)
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded")
    assert report["phase"] == "Succeeded" and report["step"] == 40
    # mpjob run allowed bf16 in place; a framework's loop re-enters instead, and the message says so
    assert first["message"].endswith("): the next attempt restarts") and "; not in place (" in first["message"]
    assert "inPlace" not in second

    # The first attempt's report names the last good checkpoint: the framework's own, adopted.
    fault = TerminationReport.parse_message((out / "attempts/a0/termination-worker0.json").read_text())
    good = fault.last_good_checkpoint
    assert good is not None and good.step == 20 and good.precision == "fp16"
    assert fault.counters.overflow_steps > 0 and fault.counters.loss_scale < 65536
    (started,) = [e for e in events if e["event"] == "attemptStarted" and e["attempt"] == 1]
    assert started["resumeFrom"] == good.path and second["startStep"] == 20 > 0
    manifest_files = json.loads((Path(good.path) / "manifest.json").read_text())["files"]
    assert any(name.endswith(WEIGHTS[framework]) and name.startswith("framework/") for name in manifest_files)

    trainer_log = (out / "attempts/a1/worker0.log").read_text().splitlines()
    resumed = [json.loads(line) for line in trainer_log if line.startswith('{"event": "resume"')]
    assert resumed and resumed[0]["path"] == good.path and resumed[0]["fromPrecision"] == "fp16"
    steps = [json.loads(line) for line in trainer_log if line.startswith('{"event": "step"')]
    assert steps[0]["step"] == 25 and steps[0]["precision"] == "bf16" and steps[0]["lossScale"] is None
