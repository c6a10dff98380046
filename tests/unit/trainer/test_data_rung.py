"""The data rung (guard.onBadData, guard.maxSkippedSteps, guard.spike): bad data and finite
loss spikes cost a rollback and a few samples, not the precision or the run."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from mpjob.controller import exposition as scrape_text
from mpjob.controller.progress import quarantine
from mpjob_contract import metrics as tm
from mpjob_contract.codes import ExitCode
from tests import warm
from tests.helpers import free_port
from tests.unit.trainer.conftest import launch_env, parse, run_trainer, spec

pytestmark = pytest.mark.unit

SCRIPT = str(Path(__file__).with_name("quarantine_script.py"))
EXPOSITION_SCRIPT = str(Path(__file__).with_name("quarantine_exposition_script.py"))


def job(
    poison: object = None, *, steps: int = 60, guard: dict[str, Any] | None = None, mode: str = "fp16", **args: object
) -> dict:
    """64 samples in batches of 8: an epoch is 8 steps, so a poisoned sample comes back every epoch."""
    task_args: dict[str, Any] = {"inputs": 8, "hidden": 16, "samples": 64, **args}
    if poison is not None:
        task_args["nonFiniteSamples"] = poison
    return spec(
        task={"builtin": "mlp", "args": task_args},
        precision={"mode": mode, "guard": guard or {}},
        training={"steps": steps, "batchSize": 8, "logEvery": 5},
    )


def weights(run_dir: Path, step: int = 60) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "ckpt" / f"step-{step:09d}" / "state.pt", weights_only=True)["model"]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def straight(tmp: Path, job_spec: dict, quarantined: list[int], *, step: int = 60) -> dict[str, torch.Tensor]:
    """A run whose data never held `quarantined` (the same order otherwise)."""
    extra = {"QUARANTINED": ",".join(map(str, quarantined)), "PYTHONPATH": os.pathsep.join(sys.path)}
    run = run_trainer(tmp, job_spec, job_spec["precision"]["mode"], argv=[SCRIPT], extra=extra)
    assert run.code == 0, run.stderr
    assert run.of("dataSkipped") == [] and run.of("replay") == []
    return weights(tmp, step)


@pytest.mark.process
def test_a_poisoned_sample_is_skipped_once_and_the_run_equals_one_that_never_saw_it(tmp_path: Path) -> None:
    run = run_trainer(tmp_path / "poisoned", job([30]), "fp16")
    assert run.code == ExitCode.SUCCESS, run.stderr
    (skipped,) = run.of("dataSkipped")  # once, though sample 30 comes back in each of ~7 epochs
    assert skipped["cause"] == "data" and skipped["samples"] == [{"first": 30, "last": 30}]
    assert [e["verdict"] for e in run.of("replay")] == ["data"]
    assert skipped["steps"] == [run.of("replay")[0]["offendingStep"]]
    report = run.report
    assert report is not None and report.precision == "fp16" and report.skipped is not None
    assert (report.skipped.count, report.skipped.samples) == (1, 1)
    assert all(e["nonFiniteLosses"] <= 1 for e in run.of("step"))
    held = torch.load(tmp_path / "poisoned/ckpt/step-000000060/state.pt", weights_only=True)["quarantine"]
    assert held["records"] == [[skipped["steps"][0], "data", [30]]]  # what a resume reads back
    clean = straight(tmp_path / "straight", job(), [30])
    assert same(weights(tmp_path / "poisoned"), clean)


@pytest.mark.process
@pytest.mark.parametrize("mode", ["bf16", "fp32"])
def test_a_bad_record_before_the_first_checkpoint_is_skipped_in_the_first_precision(tmp_path: Path, mode: str) -> None:
    # bf16 and fp32 apply the bad step (no GradScaler): the weights in memory are non-finite and
    # no checkpoint exists yet, so the replay and the rollback start from the attempt's step 0.
    early = {**job([35], steps=30, mode=mode), "checkpoint": {"everySteps": 20, "keep": 5}}
    run = run_trainer(tmp_path / "poisoned", early, mode)
    assert run.code == ExitCode.SUCCESS, (run.report, run.stderr)
    (replay,) = run.of("replay")
    (skipped,) = run.of("dataSkipped")
    assert replay["verdict"] == "data" and skipped["steps"] == [replay["offendingStep"]]
    assert skipped["fromStep"] == 0 and skipped["samples"] == [{"first": 35, "last": 35}]
    assert skipped["steps"][0] < 20  # before the first checkpoint
    if mode == "fp32":  # fp32 needs no replay: its own step is the verdict
        assert replay["steps"] == 0
    else:  # replayed from step 0's state, kept before the first step
        assert replay["fromCheckpoint"] and 0 < replay["steps"] <= replay["firstStep"] + 1
    assert run.report is not None and run.report.precision == mode
    assert same(weights(tmp_path / "poisoned", 30), straight(tmp_path / "straight", early, [35], step=30))


@pytest.mark.process
def test_a_skip_is_on_the_metrics_endpoint_as_the_report_will_say_it_and_forgiven_for_the_halt_alert(
    tmp_path: Path,
) -> None:
    """What the operator reads while the run goes on (status.skipped live) is the record the
    report ends with; the skipped step's non-finite loss is counted as forgiven, so
    non_finite_losses_total minus skipped_non_finite_losses_total (NumericFaultHalt) stays 0."""
    exposition = tmp_path / "metrics.txt"
    extra = {
        "EXPOSITION": str(exposition),
        "MPJOB_METRICS_PORT": str(free_port()),
        "MPJOB_METRICS_HOST": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    run = run_trainer(tmp_path, job([30]), "fp16", argv=[EXPOSITION_SCRIPT], extra=extra)
    assert run.code == ExitCode.SUCCESS, run.stderr
    (said,) = run.of("dataSkipped")
    assert run.report is not None and run.report.skipped is not None
    values = scrape_text.parse(exposition.read_text())
    live = quarantine(values)
    assert live is not None and live == run.report.skipped
    assert said["quarantine"] == live.model_dump(by_alias=True)  # `mpjob run`'s live record: the same
    labels = {"job": "t", "namespace": "default", "attempt": "0", "precision": "fp16"}
    registry = parser_samples(exposition.read_text())
    non_finite = registry[(tm.NON_FINITE_LOSSES + "_total", frozenset(labels.items()))]
    forgiven = registry[(tm.SKIPPED_NON_FINITE_LOSSES + "_total", frozenset(labels.items()))]
    assert non_finite >= 1 and forgiven == non_finite


def parser_samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.process
def test_with_on_bad_data_fail_a_poisoned_sample_ends_the_attempt_as_before(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, job([30], guard={"onBadData": "fail"}), "fp16")
    assert run.code == ExitCode.NON_FINITE_IN_FP32, run.stderr
    assert run.of("dataSkipped") == [] and run.report is not None and run.report.skipped is None


@pytest.mark.process
def test_bad_data_everywhere_fails_after_max_skipped_steps_naming_them(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, job("all", guard={"maxSkippedSteps": 2}), "fp16")
    assert run.code == ExitCode.NON_FINITE_IN_FP32, run.stderr
    assert [e["steps"] for e in run.of("dataSkipped")] == [[0], [1]]
    report = run.report
    assert report is not None and report.reason == "NonFiniteInFp32" and report.precision == "fp16"
    assert "data at step(s) 1, 2, 3: more than guard.maxSkippedSteps=2" in report.message
    assert report.skipped is not None and report.skipped.count == 2 and report.skipped.samples == 16


@pytest.mark.process
def test_a_sigkilled_run_resumes_with_its_quarantine_bit_identical(tmp_path: Path) -> None:
    whole = run_trainer(tmp_path / "whole", job([30]), "fp16")
    assert whole.code == 0 and len(whole.of("dataSkipped")) == 1, whole.stderr
    # 100 ms a step (an identity: the whole run's weights): the 30 steps after checkpoint 30 last
    # 3 s, so the kill lands inside the run however late this test, starved, reads the line.
    slow = job([30], stepDelay={"fp16": 0.1})
    cut = tmp_path / "cut"
    env = launch_env(cut, slow, "fp16")
    proc = warm.Popen([sys.executable, "-m", "mpjob_trainer"], env=env, stdout=warm.PIPE, text=True)
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:  # until a checkpoint after the skip is durable
        seen.append(line)
        if '"event": "checkpoint"' in line and '"step": 30' in line:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert any('"dataSkipped"' in line for line in seen)
    again = run_trainer(cut, slow, "fp16")
    assert again.code == 0, again.stderr
    # A later checkpoint than 30 (the kill landed later) still holds the quarantine: the sample
    # comes back every epoch of 8 steps, so the steps after any resume would serve it again.
    assert 30 <= again.of("resume")[0]["step"] < 60
    assert again.of("dataSkipped") == [] and again.of("replay") == []  # never served again
    assert again.report is not None and again.report.skipped is not None and again.report.skipped.count == 1
    assert same(weights(cut), weights(tmp_path / "whole"))
    assert parse("".join(seen))  # the cut run's lines fit the contract too


def spiking(action: str, *, at: int = 25, steps: int = 60, window: int = 16, log_every: int = 5) -> dict:
    guard = {"spike": {"action": action, "window": window}}
    base = job(steps=steps, batchScale={"atStep": at, "steps": 3}, guard=guard)
    training = {**base["training"], "logEvery": log_every}
    return {**base, "precision": {**base["precision"], "mode": "fp32"}, "training": training}


@pytest.mark.process
def test_a_finite_loss_spike_rolls_back_once_and_skips_its_steps(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spiking("rollback"), "fp32")
    assert run.code == 0, run.stderr
    (spike,) = run.of("lossSpike")
    assert spike["firstStep"] == 25 and 25 <= spike["lastStep"] <= 27 and spike["detectedAt"] == 30
    (skipped,) = run.of("dataSkipped")
    assert skipped["cause"] == "spike" and skipped["steps"] == list(range(25, spike["lastStep"] + 1))
    assert skipped["fromStep"] == 20 and run.of("replay") == []
    assert run.report is not None and run.report.precision == "fp32" and run.report.skipped is not None


@pytest.mark.process
def test_with_spike_off_a_loss_spike_trains_on_as_before(tmp_path: Path) -> None:
    run = run_trainer(tmp_path, spiking("off"), "fp32")
    assert run.code == 0, run.stderr
    assert run.of("lossSpike") == [] and run.of("dataSkipped") == []
    assert run.report is not None and run.report.skipped is None


@pytest.mark.process
@pytest.mark.parametrize(("at", "detected", "back_to"), [(17, 20, 10), (20, 30, 20)])
def test_a_spike_is_caught_before_a_checkpoint_after_its_onset_is_written(
    tmp_path: Path, at: int, detected: int, back_to: int
) -> None:
    """Reads fall on checkpoint steps only (every 10; logEvery 40): a spike beginning at step 17 is judged
    at step 20's read, before that checkpoint is staged, and rolled back to 10; the checkpoint at 20 is
    written only after the spiking steps are skipped. A spike beginning at step 20 rolls back to the
    checkpoint at 20: the weights its first spiking loss was computed on, before any spiking update."""
    run = run_trainer(tmp_path, spiking("rollback", at=at, steps=40, window=8, log_every=40), "fp32")
    assert run.code == 0, run.stderr
    (spike,) = run.of("lossSpike")
    assert (spike["firstStep"], spike["detectedAt"]) == (at, detected)
    (skipped,) = run.of("dataSkipped")
    assert skipped["fromStep"] == back_to and skipped["steps"] == list(range(at, spike["lastStep"] + 1))
    names = [e["event"] for e in run.events]
    saved = [
        e["step"] for e in run.events[: names.index("dataSkipped")] if e["event"] in ("checkpointStaged", "checkpoint")
    ]
    assert saved and max(saved) == back_to  # nothing saved between the spike's onset and its rollback
    held = torch.load(tmp_path / "ckpt" / f"step-{detected:09d}" / "state.pt", weights_only=True)["quarantine"]
    assert [record[0] for record in held["records"]] == skipped["steps"]  # written after the skip, with it
