"""`mpjob run` with bad data and loss spikes: the attempt rolls back and skips, and the job
still Succeeds in its first precision; the summary, status.skipped and the plot show it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

from mpjob.localrun.readings import reading_of
from mpjob.planning.observe import observe
from mpjob_contract import events
from mpjob_contract.api import AttemptStatus, MixedPrecisionJobStatus
from mpjob_contract.skipping import Skipped
from tests.unit.localrun.test_run import BASE, manifest, mpjob_run
from tests.unit.trainer.conftest import run_trainer
from tests.unit.trainer.test_data_rung import SCRIPT

pytestmark = pytest.mark.unit


def mlp(**args: object) -> dict:
    return {"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 64, **args}}


def run(tmp: Path, **spec: object) -> tuple[int, dict, str]:
    job = manifest(tmp, **{"training": {"steps": 40, "batchSize": 8, "logEvery": 5}, **spec})
    result = mpjob_run(str(job), "--out", str(tmp / "out"), "--plain")
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


@pytest.mark.process
def test_a_poisoned_sample_is_skipped_and_the_job_succeeds_in_its_first_precision(tmp_path: Path) -> None:
    code, report, out = run(tmp_path, task=mlp(nonFiniteSamples=[5]))
    assert code == 0 and report["phase"] == "Succeeded", out
    (only,) = report["attempts"]  # no fallback: one attempt, in fp16
    assert (only["precision"], only["reason"]) == ("fp16", "Succeeded")
    assert not any(c["type"] == "PrecisionFallback" for c in report["conditions"])
    skipped = report["skipped"]
    assert (skipped["count"], skipped["samples"]) == (1, 1)
    (step,) = skipped["steps"]
    assert step["cause"] == "data" and step["samples"] == [{"first": 5, "last": 5}]
    said = step["step"] + 1  # messages count steps from 1; status.skipped holds the 0-based index
    assert f"skipped: 1 step(s), 1 sample(s): step {said} (data: 5)" in out  # the summary
    assert f"skipped step(s) {said} (data; samples 5), back at checkpoint step" in out  # said as it happened
    series = json.loads((tmp_path / "out" / "series.json").read_text())
    assert series["skips"] == [{"attempt": 0, "step": step["step"], "cause": "data"}]  # what the plot marks
    # The final weights equal a straight run whose data never held sample 5 (the same order otherwise).
    clean = json.loads(json.dumps(BASE["spec"]))
    clean.update(task=mlp(), training={"steps": 40, "batchSize": 8, "logEvery": 5})
    extra = {"QUARANTINED": "5", "PYTHONPATH": os.pathsep.join(sys.path)}
    straight = run_trainer(tmp_path / "straight", clean, "fp16", argv=[SCRIPT], extra=extra)
    assert straight.code == 0, straight.stderr
    (final,) = (tmp_path / "out").rglob("step-000000040/state.pt")
    ours, theirs = (
        torch.load(p, weights_only=True)["model"] for p in (final, tmp_path / "straight/ckpt/step-000000040/state.pt")
    )
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_a_skip_line_updates_status_skipped_as_it_happens_by_the_operators_rule() -> None:
    step = {"step": 4, "cause": "data", "samples": [{"first": 5, "last": 5}]}
    quarantine = {"count": 1, "samples": 1, "steps": [step]}
    line = {"event": "dataSkipped", "cause": "data", "steps": [4], "fromStep": 0, "skippedSteps": 1}
    event = events.parse_line(json.dumps({**line, "quarantine": quarantine}))
    assert event is not None
    reading = reading_of(0, event)
    assert reading is not None
    seen = observe(MixedPrecisionJobStatus(attempts=[AttemptStatus(index=0, precision="fp16")]), reading)
    assert seen.status.skipped == Skipped.model_validate(quarantine) and [s.step for s in seen.skips] == [4]
    older = events.parse_line(json.dumps(line))  # a trainer that does not say its quarantine: the report will
    assert older is not None and reading_of(0, older) is None


@pytest.mark.process
def test_bad_data_everywhere_fails_in_one_attempt_naming_the_steps(tmp_path: Path) -> None:
    guard = {"maxSkippedSteps": 3}
    code, report, out = run(tmp_path, task=mlp(nonFiniteSamples="all"), precision={"mode": "fp16", "guard": guard})
    assert code == 1 and report["phase"] == "Failed", out
    (only,) = report["attempts"]
    assert (only["precision"], only["reason"], only["exitCode"]) == ("fp16", "NonFiniteInFp32", 45)
    assert "data at step(s) 1, 2, 3, 4: more than guard.maxSkippedSteps=3" in only["message"]
    assert report["skipped"]["count"] == 3


@pytest.mark.process
def test_a_bad_record_before_the_first_checkpoint_costs_bf16_nothing_but_the_record(tmp_path: Path) -> None:
    """bf16 applies the bad step, and with checkpoints every 20 steps none exists yet when sample 5
    (served in each 8-step epoch) first poisons the weights: the replay and the rollback start
    from the attempt's step 0, the sample is quarantined once, and the job Succeeds in bf16."""
    early = {"mode": "bf16", "fallback": ["fp32"]}
    code, report, out = run(
        tmp_path,
        task=mlp(nonFiniteSamples=[5]),
        precision=early,
        checkpoint={**BASE["spec"]["checkpoint"], "everySteps": 20},
    )
    assert code == 0 and report["phase"] == "Succeeded", out
    (only,) = report["attempts"]
    assert (only["precision"], only["reason"]) == ("bf16", "Succeeded")
    (step,) = report["skipped"]["steps"]
    assert step["step"] < 8 and step["samples"] == [{"first": 5, "last": 5}]  # met in the first epoch
