"""Real trainer processes: an attempt goes on from the checkpoints its lineage wrote, never from
those a stray Job of an ended attempt wrote beyond them, and its own saves at the stray's steps
take their places (the stray's set aside, kept)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mpjob_contract.environment import ATTEMPT_JOB_ENV
from mpjob_trainer.checkpoint.manifest import MANIFEST, folder_name
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

JOB = spec(training={"steps": 40}, checkpoint={"everySteps": 10, "keep": 10})


def _writer(ckpt: Path, step: int) -> tuple[int, str]:
    doc = json.loads((ckpt / folder_name(step) / MANIFEST).read_text())
    return doc["attempt"], doc["attemptJob"]


@pytest.mark.process
def test_the_next_attempt_resumes_from_its_lineage_not_from_the_strays_newer_checkpoints(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_trainer(tmp_path, JOB, attempt=1, lineage={0: []}, extra={ATTEMPT_JOB_ENV: "job-a1"})
    assert first.code == 0
    for step in (30, 40):  # attempt 1 ended at step 20 (as if a fault ended it there)
        shutil.rmtree(ckpt / folder_name(step))
    stray = run_trainer(tmp_path, JOB, attempt=1, lineage={0: []}, extra={ATTEMPT_JOB_ENV: "job-a1-stray"})
    assert stray.code == 0
    assert [_writer(ckpt, step)[1] for step in (20, 30, 40)] == ["job-a1", "job-a1-stray", "job-a1-stray"]
    lineage = {0: [], 1: ["job-a1"]}
    second = run_trainer(tmp_path, JOB, attempt=2, lineage=lineage, extra={ATTEMPT_JOB_ENV: "job-a2"})
    assert second.code == 0, second.stderr[-2000:]
    resumed = [e for e in second.events if e["event"] == "resume"]
    assert [e["step"] for e in resumed] == [20]
    passed = [e for e in second.events if e["event"] == "checkpointOutsideLineage"]
    assert [Path(e["path"]).name for e in passed] == [
        folder_name(40),
        folder_name(30),
        folder_name(30),
        folder_name(40),
    ]
    assert all("job-a1-stray" in e["problem"] for e in passed)
    assert [_writer(ckpt, s) for s in (20, 30, 40)] == [(1, "job-a1"), (2, "job-a2"), (2, "job-a2")]
    aside = sorted(p for p in ckpt.iterdir() if p.name.startswith(".corrupt-"))
    assert [json.loads((p / MANIFEST).read_text())["attemptJob"] for p in aside] == ["job-a1-stray"] * 2
