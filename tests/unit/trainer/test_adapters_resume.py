"""Framework checkpoints as mpjob checkpoints: a corrupted newest one is skipped for the
previous good one, and a run SIGKILLed mid-way resumes through the framework's own resume
(global step, optimizer, LR scheduler, GradScaler, RNG) and ends bit for bit where a straight
run ends (both frameworks, fp16 on a CPU: the scaler state is part of what must match). The
Lightning example shares its data out between DDP ranks, so a resumed rank reads where it was."""

from __future__ import annotations

import importlib.util
import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from mpjob_trainer.adapters.hf import resume_view
from tests import warm
from tests.helpers import mpjob_run_json, wait_for
from tests.unit.trainer.adapter_jobs import FRAMEWORKS, REPO, WEIGHTS, command, job
from tests.unit.trainer.conftest import launch_env, run_trainer
from tests.unit.trainer.test_own_loop_resume import assert_identical

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_a_corrupted_newest_framework_checkpoint_is_skipped(tmp_path: Path, framework: str) -> None:
    spec = job(framework, training={"steps": 20}, checkpoint={"everySteps": 10, "keep": 3})
    first = run_trainer(tmp_path, spec, "fp32", argv=command(framework)[1:], name="a0.json")
    assert first.code == 0, first.stderr[-3000:]
    newest = tmp_path / "ckpt/step-000000020/framework"
    weights = next(newest.rglob(WEIGHTS[framework]))
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit of the framework's own file
    weights.write_bytes(bytes(data))

    longer = job(framework, training={"steps": 30}, checkpoint={"everySteps": 10, "keep": 3})
    second = run_trainer(tmp_path, longer, "fp32", argv=command(framework)[1:], attempt=1, name="a1.json")
    assert second.code == 0, second.stderr[-3000:]
    (rejected,) = second.of("checkpointRejected")
    assert rejected["path"].endswith("step-000000020") and "sha256 mismatch" in rejected["problem"]
    assert second.of("resume")[0]["step"] == 10
    assert second.report is not None and second.report.start_step == 10 and second.report.step == 30


def start(tmp: Path, spec: dict[str, Any], attempt: int, pace: float = 0.0) -> warm.Popen:
    """The spec's command as attempt `attempt`, each optimizer step `pace` seconds longer."""
    extra = {"PACED_STEP_SECONDS": str(pace)}
    env = launch_env(tmp, spec, "fp16", attempt=attempt, name=f"a{attempt}.json", extra=extra)
    return warm.Popen(spec["task"]["command"], env=env, stdout=warm.PIPE, stderr=warm.STDOUT, text=True)


def finish(proc: warm.Popen) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def framework_state(folder: Path, framework: str) -> dict[str, Any]:
    """What the framework itself saved: weights, optimizer, scheduler, scaler, its step."""
    if framework == "lightning":
        ckpt = torch.load(folder / "lightning.ckpt", weights_only=False)
        keys = ("state_dict", "optimizer_states", "lr_schedulers", "MixedPrecision", "global_step")
        return {k: ckpt.get(k) for k in keys}  # no MixedPrecision (scaler) state outside fp16
    (hf,) = folder.iterdir() if not (folder / "trainer_state.json").exists() else [folder]
    return {
        "model": load_file(hf / "model.safetensors"),
        **{
            name: torch.load(hf / f"{name}.pt", weights_only=True)
            for name in ("optimizer", "scheduler", "scaler")
            if (hf / f"{name}.pt").exists()  # no scaler outside fp16
        },
        "global_step": json.loads((hf / "trainer_state.json").read_text())["global_step"],
    }


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_killed_and_rerun_ends_bit_identical(tmp_path: Path, framework: str) -> None:
    steps = 120
    spec = job(
        framework, training={"steps": steps}, precision={"mode": "fp16"}, checkpoint={"everySteps": 10}, paceable=True
    )
    straight = finish(start(tmp_path / "straight", spec, attempt=0))
    assert straight[-1]["event"] == "done"

    cut = tmp_path / "cut"
    # 50 ms a step (the other runs are not paced): the 110 steps after the first checkpoint last
    # 5.5 s, so the kill lands inside the run however late this test, starved, sends it.
    proc = start(cut, spec, attempt=0, pace=0.05)

    def trained() -> list[Path]:  # a checkpoint after training began (a fresh start also checkpoints step 0)
        return [m for m in (cut / "ckpt").glob("step-*/manifest.json") if m.parent.name != "step-000000000"]

    wait_for(trained, 90, interval=0.02, message="a checkpoint")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (cut / "ckpt" / f"step-{steps:09d}").exists(), "killed before the end"
    resumed = finish(start(cut, spec, attempt=1))
    (resume,) = [e for e in resumed if e["event"] == "resume"]
    assert 0 < resume["step"] < steps

    final = f"step-{steps:09d}"
    a = framework_state(tmp_path / "straight/ckpt" / final / "framework", framework)
    b = framework_state(cut / "ckpt" / final / "framework", framework)
    assert a["global_step"] == b["global_step"] == steps
    assert_identical(a, b)
    sdk_a = torch.load(tmp_path / "straight/ckpt" / final / "state.pt", weights_only=True)
    sdk_b = torch.load(cut / "ckpt" / final / "state.pt", weights_only=True)
    assert_identical(sdk_a, sdk_b)  # applied steps, the session's scaler, RNG states


@pytest.mark.process
def test_a_trainer_resumed_out_of_fp16_leaves_no_view_of_the_checkpoint_behind(tmp_path: Path) -> None:
    """The bf16 attempt after an fp16 one resumes from a view of the fp16 checkpoint without its
    scaler state; the view is gone once the Trainer has trained, the checkpoint untouched."""
    spec = job("hf", training={"steps": 20}, precision={"mode": "fp16"}, checkpoint={"everySteps": 10})
    first = run_trainer(tmp_path, spec, "fp16", argv=command("hf")[1:], name="a0.json")
    assert first.code == 0, first.stderr[-3000:]
    longer = job("hf", training={"steps": 30}, precision={"mode": "fp16"}, checkpoint={"everySteps": 10})
    second = run_trainer(tmp_path, longer, "bf16", argv=command("hf")[1:], attempt=1, name="a1.json")
    assert second.code == 0, second.stderr[-3000:]
    assert second.of("resume")[0]["step"] == 20 and second.of("resume")[0]["fromPrecision"] == "fp16"
    assert second.report is not None and second.report.step == 30
    assert (tmp_path / "ckpt/step-000000020/framework/scaler.pt").is_file()
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))


@pytest.mark.process
def test_the_hf_adapters_saves_print_no_progress_bars(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, job("hf", training={"steps": 4}, checkpoint={"everySteps": 2}), argv=command("hf")[1:])
    assert run.code == 0, run.stderr[-3000:]
    assert len(list((tmp_path / "ckpt").glob("step-*"))) == 3  # steps 0, 2 and 4 saved
    assert "Writing model shards" not in run.stderr and "it/s]" not in run.stderr


def test_each_rank_resumes_from_its_own_view_removed_when_the_trainer_is_done(tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt/step-000000020/framework"
    checkpoint.mkdir(parents=True)
    for name in ("model.safetensors", "scaler.pt", "rng_state_1.pth"):
        (checkpoint / name).write_text(name)
    with pytest.raises(RuntimeError), resume_view(checkpoint, "bf16", 0) as zero:
        with resume_view(checkpoint, "bf16", 1) as one:  # ranks of two pods, and both of the same pid
            assert zero is not None and one is not None and zero != one
            for view in (Path(zero), Path(one)):
                assert sorted(p.name for p in view.iterdir()) == ["model.safetensors", "rng_state_1.pth"]
                assert (view / "model.safetensors").read_text() == "model.safetensors"
        assert not Path(one).exists() and Path(zero).exists()
        raise RuntimeError("the Trainer failed")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000000020"]
    assert sorted(p.name for p in checkpoint.iterdir()) == ["model.safetensors", "rng_state_1.pth", "scaler.pt"]
    with resume_view(checkpoint, "fp16", 0) as same:  # fp16 resumes its scaler: the checkpoint itself
        assert same == str(checkpoint)


def test_the_lightning_examples_ranks_read_disjoint_batches_and_resume_where_they_were() -> None:
    found = importlib.util.spec_from_file_location("lightning_example", REPO / "examples/lightning/train.py")
    assert found is not None and found.loader is not None
    example = importlib.util.module_from_spec(found)
    found.loader.exec_module(example)

    def batches(rank: int, start: int, count: int) -> list[list[int]]:
        drawn = iter(example.Batches(64, 4, rank, 2, seed=0, start=start))
        return [next(drawn) for _ in range(count)]

    zero, one = batches(0, 0, 12), batches(1, 0, 12)
    for epoch in (slice(0, 8), slice(8, 12)):  # 64 samples: 8 global batches of 2 ranks x 4
        seen = [i for b in zero[epoch] + one[epoch] for i in b]
        assert len(seen) == len(set(seen))  # no sample read by both ranks within an epoch
    assert sorted(i for b in zero[:8] + one[:8] for i in b) == list(range(64))
    assert batches(0, 5, 7) == zero[5:] and batches(1, 5, 7) == one[5:]


@pytest.mark.process
def test_the_lightning_example_trains_in_two_processes(tmp_path: Path) -> None:
    spec = job("lightning", training={"steps": 20}, resources={"gpusPerWorker": 0, "processesPerWorker": 2})
    manifest = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "ddp"}}
    _, report, _ = mpjob_run_json(tmp_path, {**manifest, "spec": spec}, timeout=240, frameworks=True)
    assert report["phase"] == "Succeeded" and report["step"] == 20 and len(report["attempts"]) == 1
