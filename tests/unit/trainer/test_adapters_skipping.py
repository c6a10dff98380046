"""The data rung under the framework adapters (guard.onBadData skip, the default): a poisoned
batch under the Hugging Face Trainer or Lightning costs a rollback and that step, not the
precision or the run. The session rolls back, quarantines the step whole (the frameworks
cannot name dataset indices), and the adapter re-enters the framework from the checkpoint; the
quarantined step trains on nothing. The run then ends bit for bit where a straight run ends
whose data has no batch at that step (same order otherwise), and a run killed after the skip
resumes with the quarantine from its checkpoint and ends bit-identical too."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from mpjob_contract.codes import ExitCode
from tests import warm
from tests.helpers import NO_PLOT, run_to_end, wait_for
from tests.unit.trainer.conftest import launch_env, parse, run_trainer, spec
from tests.unit.trainer.test_adapters_resume import framework_state
from tests.unit.trainer.test_own_loop_resume import assert_identical

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("framework_script.py"))
FRAMEWORKS = ["hf", "lightning"]
#: A sample each framework serves within the run: HF's shuffled order puts sample 7 in step 4,
#: before the first interval's checkpoint (the rollback goes to the step-0 checkpoint a fresh
#: start writes); Lightning's in-order loader puts sample 100 in step 12 (back to step 10).
POISON = {"hf": "7", "lightning": "100"}


def job(framework: str, *extra: str, steps: int = 30) -> dict[str, Any]:
    """fp16 with the default guard: GradScaler skips the poisoned step and the session replays
    the non-finite loss at its next read (logEvery 5)."""
    return spec(
        task={"command": [sys.executable, SCRIPT, framework, *extra]},
        training={"steps": steps, "batchSize": 8, "logEvery": 5, "seed": 0, "learningRate": 1e-3},
        precision={"mode": "fp16", "fallback": ["bf16"]},
        checkpoint={"everySteps": 10, "keep": 40},
    )


def run(tmp: Path, framework: str, *extra: str, every: int = 10) -> Any:
    argv = [SCRIPT, framework, *extra]
    spec_ = job(framework, *extra)
    spec_["checkpoint"]["everySteps"] = every
    return run_trainer(tmp, spec_, "fp16", argv=argv)


def final(tmp: Path, framework: str, steps: int = 30) -> dict[str, Any]:
    return framework_state(tmp / "ckpt" / f"step-{steps:09d}" / "framework", framework)


def sdk_state(tmp: Path, steps: int = 30) -> dict[str, Any]:
    return torch.load(tmp / "ckpt" / f"step-{steps:09d}" / "state.pt", weights_only=True)


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_a_poisoned_batch_is_skipped_in_the_same_attempt_and_precision(tmp_path: Path, framework: str) -> None:
    skipping = run(tmp_path / "poisoned", framework, "--poison", POISON[framework])
    assert skipping.code == ExitCode.SUCCESS, skipping.stderr[-3000:]
    (replay,) = skipping.of("replay")
    assert replay["verdict"] == "data"
    (skipped,) = skipping.of("dataSkipped")
    step = replay["offendingStep"]
    assert skipped["cause"] == "data" and skipped["steps"] == [step] and skipped["samples"] == []
    assert skipped["fromStep"] == (0 if framework == "hf" else 10) and skipped["fromStep"] <= step
    report = skipping.report
    assert report is not None and report.precision == "fp16" and skipping.of("fault") == []
    assert report.skipped is not None and report.skipped.count == 1 and report.skipped.steps[0].step == step
    assert report.skipped.samples == 8  # the step skipped whole: its batch
    assert sdk_state(tmp_path / "poisoned")["quarantine"]["records"] == [[step, "data", [], 8]]

    # A straight run whose data has no batch at that step: the adapter's quarantine from the
    # start (no fault, no rollback), and for Lightning also the script's own training_step
    # returning None there; a run that trains on that step (the batch clean) ends elsewhere.
    seeded = run(tmp_path / "seeded", framework, "--quarantine", str(step), every=1)
    assert seeded.code == ExitCode.SUCCESS and seeded.of("dataSkipped") == [], seeded.stderr[-3000:]
    assert_identical(final(tmp_path / "poisoned", framework), final(tmp_path / "seeded", framework))
    # The quarantined step trained on nothing: weights and optimizer state as before it (its
    # global step and LR schedule went on).
    before, after = (final(tmp_path / "seeded", framework, at) for at in (step, step + 1))
    if framework == "hf":
        assert_identical(before["model"], after["model"])
        assert_identical(before["optimizer"]["state"], after["optimizer"]["state"])
    else:
        assert_identical(before["state_dict"], after["state_dict"])
        assert_identical(before["optimizer_states"][0]["state"], after["optimizer_states"][0]["state"])
    if framework == "lightning":
        empty = run(tmp_path / "empty", framework, "--empty-step", str(step))
        assert empty.code == ExitCode.SUCCESS, empty.stderr[-3000:]
        assert_identical(final(tmp_path / "poisoned", framework), final(tmp_path / "empty", framework))
    clean = run(tmp_path / "clean", framework)
    assert clean.code == ExitCode.SUCCESS, clean.stderr[-3000:]
    with pytest.raises(AssertionError):
        assert_identical(final(tmp_path / "poisoned", framework), final(tmp_path / "clean", framework))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_on_bad_data_fail_keeps_ending_the_attempt_non_finite_in_fp32(tmp_path: Path, framework: str) -> None:
    failing = job(framework, "--poison", POISON[framework])
    failing["precision"]["guard"] = {"onBadData": "fail", "maxNonFiniteLosses": 1}
    argv = [SCRIPT, framework, "--poison", POISON[framework]]
    ended = run_trainer(tmp_path, failing, "fp16", argv=argv)
    assert ended.code == ExitCode.NON_FINITE_IN_FP32, ended.stderr[-3000:]
    assert ended.of("dataSkipped") == [] and ended.report is not None and ended.report.skipped is None


#: A sample each framework serves before its first interval checkpoint (every 20 steps) in bf16.
POISON_EARLY = {"hf": "7", "lightning": "30"}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_a_bad_batch_before_the_first_checkpoint_in_bf16_costs_a_step_not_the_precision(
    tmp_path: Path, framework: str
) -> None:
    """bf16 applies the bad step (no GradScaler), so the weights in memory are non-finite: the
    replay loads the framework's step-0 checkpoint (the fresh start's) and replays from there in
    fp32, finds the data at fault, and the step is skipped in bf16."""

    def bf16(*extra: str) -> Any:
        argv = [SCRIPT, framework, *extra]
        spec_ = job(framework, *extra)
        spec_["precision"] = {"mode": "bf16", "fallback": ["fp32"]}
        spec_["checkpoint"]["everySteps"] = 20
        return run_trainer(tmp_path / "-".join(extra or ("clean",)), spec_, "bf16", argv=argv)

    poisoned = bf16("--poison", POISON_EARLY[framework])
    assert poisoned.code == ExitCode.SUCCESS and poisoned.of("fault") == [], poisoned.stderr[-3000:]
    (replay,) = poisoned.of("replay")
    assert replay["verdict"] == "data" and replay["fromCheckpoint"] is True
    (skipped,) = poisoned.of("dataSkipped")
    assert skipped["fromStep"] == 0 and skipped["steps"] == [replay["offendingStep"]] and replay["offendingStep"] < 20
    assert poisoned.report is not None and poisoned.report.precision == "bf16"
    seeded = bf16("--quarantine", str(replay["offendingStep"]))
    assert seeded.code == ExitCode.SUCCESS and seeded.of("replay") == [], seeded.stderr[-3000:]
    assert_identical(
        *(
            final(tmp_path / "-".join(a), framework)
            for a in (("--poison", POISON_EARLY[framework]), ("--quarantine", str(replay["offendingStep"])))
        )
    )


def spiking(framework: str, *extra: str) -> dict[str, Any]:
    """bf16 (the loss is finite: a spike, not a fault) with guard.spike on, a short window."""
    spiking_job = job(framework, *extra)
    spiking_job["precision"] = {"mode": "bf16", "fallback": [], "guard": {"spike": {"action": "rollback", "window": 8}}}
    return spiking_job


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_a_loss_spike_rolls_back_and_skips_its_steps_under_a_framework(tmp_path: Path, framework: str) -> None:
    argv = [SCRIPT, framework, "--spike-at", "12"]  # steps 12-14: the output 1e3 times larger
    spiked = run_trainer(tmp_path / "spiked", spiking(framework, *argv[2:]), "bf16", argv=argv)
    assert spiked.code == ExitCode.SUCCESS, spiked.stderr[-3000:]
    (spike,) = spiked.of("lossSpike")
    assert (spike["firstStep"], spike["lastStep"], spike["detectedAt"]) == (12, 14, 15)
    (skipped,) = spiked.of("dataSkipped")
    assert skipped["cause"] == "spike" and skipped["steps"] == [12, 13, 14] and skipped["fromStep"] == 10
    assert spiked.report is not None and spiked.report.skipped is not None and spiked.report.skipped.count == 3

    seeded_argv = [SCRIPT, framework, "--quarantine", "12,13,14"]
    seeded = run_trainer(tmp_path / "seeded", spiking(framework, *seeded_argv[2:]), "bf16", argv=seeded_argv)
    assert seeded.code == ExitCode.SUCCESS and seeded.of("lossSpike") == [], seeded.stderr[-3000:]
    assert_identical(final(tmp_path / "spiked", framework), final(tmp_path / "seeded", framework))


def start(tmp: Path, spec_: dict[str, Any], argv: list[str], attempt: int, pace: float = 0.0) -> warm.Popen:
    extra = {"FRAMEWORK_SCRIPT_STEP_SECONDS": str(pace)}
    env = launch_env(tmp, spec_, "fp16", attempt=attempt, name=f"a{attempt}.json", extra=extra)
    return warm.Popen([sys.executable, *argv], env=env, stdout=warm.PIPE, stderr=warm.STDOUT, text=True)


def finish(proc: warm.Popen) -> list[dict[str, Any]]:
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    return parse("\n".join(line for line in out.splitlines() if line.startswith("{")))


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_killed_after_a_skip_resumes_with_the_quarantine_and_ends_bit_identical(tmp_path: Path, framework: str) -> None:
    steps = 60
    argv = [SCRIPT, framework, "--poison", POISON[framework]]
    spec_ = job(framework, *argv[2:], steps=steps)
    straight = finish(start(tmp_path / "straight", spec_, argv, attempt=0))
    (skipped,) = [e for e in straight if e["event"] == "dataSkipped"]

    cut = tmp_path / "cut"
    # 100 ms a step (the straight and resumed runs are not paced): the 40 steps after checkpoint 20
    # last 4 s, so the kill lands inside the run however late this test, starved, sends it.
    proc = start(cut, spec_, argv, attempt=0, pace=0.1)
    after_skip = cut / "ckpt" / "step-000000020" / "manifest.json"  # written after the rollback
    wait_for(after_skip.exists, 120, interval=0.02, message="a checkpoint after the skip")
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert not (cut / "ckpt" / f"step-{steps:09d}").exists(), "killed before the end"
    assert torch.load(after_skip.with_name("state.pt"), weights_only=True)["quarantine"]["records"] == [
        [skipped["steps"][0], "data", [], 8]
    ]
    resumed = finish(start(cut, spec_, argv, attempt=1))
    (resume,) = [e for e in resumed if e["event"] == "resume"]
    assert 20 <= resume["step"] < steps
    assert [e for e in resumed if e["event"] in ("dataSkipped", "replay")] == []
    report = json.loads((cut / "a1.json").read_text())
    assert report["skipped"]["count"] == 1 and report["skipped"]["samples"] == 8 and report["precision"] == "fp16"

    assert_identical(final(tmp_path / "straight", framework, steps), final(cut, framework, steps))
    assert_identical(sdk_state(tmp_path / "straight", steps), sdk_state(cut, steps))  # quarantine, RNG, scaler


def manifest(framework: str, *extra: str) -> dict[str, Any]:
    """The job as `mpjob run` reads it, with two processes (DDP on the CPU)."""
    single = job(framework, *extra)
    single["resources"] = {"gpusPerWorker": 0, "processesPerWorker": 2}
    return {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": "two"},
        "spec": single,
    }


def mpjob_run(tmp: Path, framework: str, *extra: str) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    (tmp / "job.yaml").write_text(yaml.safe_dump(manifest(framework, *extra)))
    command = [sys.executable, "-m", "mpjob.cli", "run", str(tmp / "job.yaml"), "--out", str(tmp / "out"), *NO_PLOT]
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}, frameworks=True)
    result = run_to_end(command, tmp / "out", 300, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    return json.loads((tmp / "out" / "report.json").read_text())


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_two_processes_skip_a_poisoned_batch_together(tmp_path: Path, framework: str) -> None:
    """Every rank replays, rolls back, re-enters its framework (DDP re-wrapped) and trains on
    nothing at the quarantined step, so the ranks stay in step and the job Succeeds in fp16."""
    status = mpjob_run(tmp_path / "poisoned", framework, "--poison", POISON[framework])
    (attempt,) = status["attempts"]
    assert (attempt["precision"], attempt["reason"], attempt["worldSize"]) == ("fp16", "Succeeded", 2)
    (skipped,) = status["skipped"]["steps"]
    assert skipped["cause"] == "data" and status["skipped"]["samples"] == 16  # both ranks' batches
    mpjob_run(tmp_path / "seeded", framework, "--quarantine", str(skipped["step"]))
    final_ = Path("out/checkpoints/step-000000030/framework")
    a, b = (framework_state(tmp_path / run_ / final_, framework) for run_ in ("poisoned", "seeded"))
    assert_identical(a, b)


def grad_norms(lines: list[dict[str, Any]]) -> dict[int, Any]:
    return {e["step"]: e["gradNorm"] for e in lines if e["event"] == "step"}


@pytest.mark.process
def test_after_a_skip_the_hf_step_lines_carry_each_steps_own_grad_norm(tmp_path: Path) -> None:
    """The fp32 replay's non-finite norm is not what the steps after the skip report: each log
    line carries its own step's norm, the one a run that never met the batch reports too."""
    poisoned = run(tmp_path / "poisoned", "hf", "--poison", POISON["hf"])
    assert poisoned.code == ExitCode.SUCCESS, poisoned.stderr[-3000:]
    (skipped,) = poisoned.of("dataSkipped")
    after = grad_norms(poisoned.events[poisoned.events.index(skipped) :])
    assert sorted(after) == [5, 10, 15, 20, 25, 30]
    quarantined = skipped["steps"][0] + 1  # 1-based, as the step lines count
    assert after[quarantined] == 0.0  # it trained on nothing
    assert all(isinstance(norm, float) and 0.0 < norm < 1e3 for step, norm in after.items() if step != quarantined)
    seeded = run(tmp_path / "seeded", "hf", "--quarantine", str(skipped["steps"][0]))
    assert seeded.code == ExitCode.SUCCESS, seeded.stderr[-3000:]
    assert after == grad_norms(seeded.events)


@pytest.mark.process
def test_after_a_skip_the_lightning_step_lines_show_no_replayed_grad_norm(tmp_path: Path) -> None:
    """Lightning tells the session no gradient norm: its step lines carry none, after a skip
    too, never the fp32 replay's non-finite one."""
    poisoned = run(tmp_path, "lightning", "--poison", POISON["lightning"])
    assert poisoned.code == ExitCode.SUCCESS, poisoned.stderr[-3000:]
    (skipped,) = poisoned.of("dataSkipped")
    assert sorted(grad_norms(poisoned.events[poisoned.events.index(skipped) :])) == [15, 20, 25, 30]
    assert set(grad_norms(poisoned.events).values()) == {None}


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.process
def test_an_fp32_batch_with_a_finite_loss_and_a_non_finite_gradient_is_the_step_skipped(
    tmp_path: Path, framework: str
) -> None:
    """The sample spoils the weights at its own step; the first non-finite loss comes a step later,
    on healthy samples. The framework steps its own optimizer: the step skipped is still the sample's."""
    poisoned = job(framework, "--bad-gradient", POISON[framework])
    poisoned["precision"] = {"mode": "fp32"}
    argv = poisoned["task"]["command"][1:]
    skipping = run_trainer(tmp_path, poisoned, "fp32", argv=argv)
    assert skipping.code == ExitCode.SUCCESS, (skipping.report and skipping.report.message, skipping.stderr[-1500:])
    (replay,) = skipping.of("replay")
    (poisoned_step,) = ({"hf": 4, "lightning": 12}[framework],)  # where the sample is served (POISON)
    assert (replay["verdict"], replay["offendingStep"]) == ("data", poisoned_step), replay
    (skipped,) = skipping.of("dataSkipped")
    assert skipped["steps"] == [poisoned_step], skipped
