"""A framework's checkpoint damaged after its save is the checkpoint's fault, never the
precision's: the fp32 replay of a fault the framework applied (bf16) loads the framework's
checkpoint by the resume's rule, passing over the damaged one (checkpointRejected) for the one
before it, as the replay of a loop on the SDK does (test_replay_damaged_checkpoint)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mpjob_contract.codes import ExitCode
from tests.unit.trainer.adapter_jobs import WEIGHTS, command
from tests.unit.trainer.adapter_jobs import job as adapter_job
from tests.unit.trainer.conftest import run_trainer
from tests.unit.trainer.test_adapters_skipping import POISON, SCRIPT, job

pytestmark = pytest.mark.unit


@pytest.mark.process
def test_a_damaged_framework_checkpoint_is_passed_over_by_the_replay_and_the_precision_kept(tmp_path: Path) -> None:
    """bf16 applies the poisoned step 12 to the weights, so the replay loads the framework's
    checkpoint of step 10, whose weights file was cut short at step 11: it is rejected, the
    fresh start's step-0 checkpoint is replayed from, the data is blamed and the step skipped."""
    damaged = tmp_path / "ckpt" / "step-000000010" / "framework" / "lightning.ckpt"
    extra = ["--poison", POISON["lightning"], "--truncate", f"11:{damaged}"]
    spec = job("lightning", *extra)
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    run = run_trainer(tmp_path, spec, "bf16", argv=[SCRIPT, "lightning", *extra])
    assert run.code == ExitCode.SUCCESS and run.of("fault") == [], run.stderr[-3000:]
    (rejected,) = run.of("checkpointRejected")
    assert rejected["path"].endswith("step-000000010"), rejected
    (replay,) = run.of("replay")
    assert replay["verdict"] == "data" and replay["fromCheckpoint"] is True and replay["offendingStep"] == 12
    (skipped,) = run.of("dataSkipped")
    assert skipped["fromStep"] == 0 and skipped["steps"] == [12]
    assert run.report is not None and run.report.precision == "bf16"


@pytest.mark.process
def test_a_framework_checkpoint_bad_inside_is_marked_and_passed_over_by_the_replay(tmp_path: Path) -> None:
    """As above, but the manifest is written again over the cut file: the checkpoint of step 10
    passes its sha256 and Lightning's file in it does not load. That is the checkpoint's fault,
    as on the SDK's path: it is marked unloadable and passed over for the step-0 checkpoint (the
    replay's verdict stands, the precision is kept), and the save of step 10 after the rollback
    sets it aside for its own."""
    ckpt = tmp_path / "ckpt"
    damaged = ckpt / "step-000000010" / "framework" / "lightning.ckpt"
    extra = ["--poison", POISON["lightning"], "--truncate", f"11:{damaged}:rehash"]
    spec = job("lightning", *extra)
    spec["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
    run = run_trainer(tmp_path, spec, "bf16", argv=[SCRIPT, "lightning", *extra])
    assert run.code == ExitCode.SUCCESS and run.of("fault") == [], run.stderr[-3000:]
    (rejected,) = run.of("checkpointRejected")
    assert rejected["path"].endswith("step-000000010") and "lightning.ckpt" in rejected["problem"], rejected
    (replay,) = run.of("replay")
    assert replay["verdict"] == "data" and replay["fromCheckpoint"] is True and replay["offendingStep"] == 12
    (skipped,) = run.of("dataSkipped")
    assert skipped["fromStep"] == 0 and skipped["steps"] == [12]  # back to the step-0 checkpoint
    assert run.report is not None and run.report.precision == "bf16"
    aside = [p.name for p in ckpt.iterdir() if p.name.startswith(".corrupt-step-000000010-")]
    assert len(aside) == 1  # the save of step 10 set the unloadable one aside and wrote its own
    assert not (ckpt / ".unloadable-step-000000010").exists()  # its mark went with it


def _sound(weights: Path) -> bool:
    """Does the framework's weights file load (the save of its step wrote it again)?"""
    if weights.suffix == ".safetensors":
        return bool(load_file(weights))
    return "state_dict" in torch.load(weights, map_location="cpu", weights_only=False)


@pytest.mark.process
@pytest.mark.parametrize("framework", ["hf", "lightning"])
def test_a_last_step_checkpoint_bad_inside_is_marked_and_the_last_steps_trained_again(
    tmp_path: Path, framework: str
) -> None:
    """A retry that finds the run done reads the framework's weights of the last step (as after
    train() or fit()); a weights file cut short under a manifest written again over it is the
    checkpoint's fault: rejected and marked unloadable (the attempt an InfraError, no loader's own
    error), so the next attempt resumes from the one before it and trains the last steps again."""
    spec = adapter_job(framework, training={"steps": 20}, checkpoint={"everySteps": 10, "keep": 3})
    argv = command(framework)[1:]
    first = run_trainer(tmp_path, spec, "fp32", argv=argv, name="a0.json")
    assert first.code == ExitCode.SUCCESS, first.stderr[-3000:]
    last = tmp_path / "ckpt" / "step-000000020"
    weights = next((last / "framework").rglob(WEIGHTS[framework]))
    data = weights.read_bytes()[: weights.stat().st_size // 2]
    weights.write_bytes(data)
    manifest = json.loads((last / "manifest.json").read_text())
    manifest["files"][str(weights.relative_to(last))] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (last / "manifest.json").write_text(json.dumps(manifest))

    done = run_trainer(tmp_path, spec, "fp32", argv=argv, attempt=1, name="a1.json")
    assert done.code == ExitCode.INFRA_ERROR, done.stderr[-3000:]
    (rejected,) = done.of("checkpointRejected")
    assert rejected["path"].endswith("step-000000020") and WEIGHTS[framework] in rejected["problem"], rejected
    assert done.report is not None and done.report.message.startswith("CorruptCheckpoint: step-000000020")
    assert (tmp_path / "ckpt" / ".unloadable-step-000000020").exists()

    again = run_trainer(tmp_path, spec, "fp32", argv=argv, attempt=2, name="a2.json")
    assert again.code == ExitCode.SUCCESS, again.stderr[-3000:]
    assert again.of("resume")[0]["step"] == 10 and [e["step"] for e in again.of("checkpoint")] == [20]
    assert _sound(next((last / "framework").rglob(WEIGHTS[framework])))  # the save of step 20 replaced it
