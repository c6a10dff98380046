"""A checkpoint whose files pass their sha256 and still do not load is known as such by the
attempts after the one that found it (checkpoint.unloadable): the next attempt, another
process in another precision resuming from the checkpoint before it, replaces it when it saves
its step (the damaged one set aside), instead of keeping it as its last good checkpoint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.conftest import run_trainer, spec

pytestmark = pytest.mark.unit

#: fp16 overflows from step 14 on (fp32 and bf16 train on): the fp16 attempt ends before step 20.
JOB = spec(
    task={"builtin": "mlp", "args": {"inputs": 8, "hidden": 16, "samples": 256, "overflowAtStep": 14}},
    training={"steps": 30, "logEvery": 2},
    checkpoint={"everySteps": 10, "keep": 5},
)


def _unloadable(folder: Path) -> str:
    """Make the checkpoint in `folder` one that verifies and does not load (a count that is none,
    its manifest recomputed over it); its new state sha256."""
    state = torch.load(folder / "state.pt", weights_only=True)
    state["samples"] = -1
    torch.save(state, folder / "state.pt")
    body = (folder / "state.pt").read_bytes()
    manifest = json.loads((folder / "manifest.json").read_text())
    sha256 = hashlib.sha256(body).hexdigest()
    manifest["files"]["state.pt"] = {"sha256": sha256, "bytes": len(body)}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return sha256


@pytest.mark.process
def test_a_later_attempts_save_of_its_step_replaces_a_checkpoint_an_earlier_attempt_could_not_load(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_trainer(tmp_path, {**JOB, "training": {**JOB["training"], "steps": 20}}, "fp32", name="r0.json")
    assert first.code == 0, first.stderr
    damaged = _unloadable(ckpt / "step-000000020")

    fp16 = run_trainer(tmp_path, JOB, "fp16", attempt=1, name="r1.json")
    assert fp16.code == ExitCode.NUMERIC_FAULT, fp16.stderr
    assert [e["path"] for e in fp16.of("checkpointRejected")][:1] == [str(ckpt / "step-000000020")]
    assert fp16.report is not None and fp16.report.last_good_checkpoint is not None
    assert fp16.report.last_good_checkpoint.step == 10

    bf16 = run_trainer(
        tmp_path, JOB, "bf16", attempt=2, name="r2.json", resume_from=fp16.report.last_good_checkpoint.path
    )
    assert bf16.code == 0, bf16.stderr
    assert bf16.of("resume")[0]["step"] == 10
    saved = {e["step"]: e for e in bf16.of("checkpoint")}
    assert saved[20]["sha256"] != damaged  # its own save, not the checkpoint that did not load
    state = torch.load(ckpt / "step-000000020" / "state.pt", weights_only=True)
    assert state["precision"] == "bf16" and state["samples"] >= 0
    aside = [p.name for p in ckpt.iterdir() if p.name.startswith(".corrupt-step-000000020-")]
    assert len(aside) == 1  # the one that did not load, set aside for diagnosis, not deleted
    assert torch.load(ckpt / aside[0] / "state.pt", weights_only=True)["samples"] == -1
