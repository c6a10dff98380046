"""`mpjob run`: the manifest on this machine, through the operator's planner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
import yaml

from mpjob.planning.figures import round_sig
from mpjob_contract.report import TerminationReport
from tests import warm
from tests.helpers import NO_PLOT, children, gone, paced, wait_for
from tests.unit.localrun.stall_task import SPEC
from tests.unit.localrun.tiny import tiny_job

pytestmark = pytest.mark.unit

BASE = {
    "apiVersion": "mpjob.dev/v1alpha1",
    "kind": "MixedPrecisionJob",
    "metadata": {"name": "local"},
    "spec": {
        "task": {
            "builtin": "gpt",
            "args": {"nLayer": 1, "nHead": 2, "nEmbd": 32, "blockSize": 32, "corpusBytes": 20000},
        },
        "training": {"steps": 40, "batchSize": 4, "logEvery": 5},
        "precision": {"mode": "fp16", "fallback": ["bf16", "fp32"]},
        "checkpoint": {"everySteps": 10},
        "resources": {"gpusPerWorker": 0},
    },
}


def manifest(tmp: Path, **spec: object) -> Path:
    doc = json.loads(json.dumps(BASE))
    doc["spec"].update(spec)
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def mpjob_run(*args: str, timeout: float = 300, plot: bool = False) -> subprocess.CompletedProcess[str]:
    """`mpjob run ARGS`, its ranks warm; `plot`: it draws training.png (not asked for otherwise)."""
    env = warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"})
    argv = [sys.executable, "-m", "mpjob.cli", "run", *args, *([] if plot else NO_PLOT)]
    return warm.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def long_bf16_job(tmp: Path, steps: int = 3000) -> Path:
    """A bf16 job long enough to be stopped while it trains, by the clock (50 ms a step: minutes)
    however fast this machine trains and however late a starved test stops it; a rerun of
    `steps` (the same task: its checkpoints' digest) trains the few steps left."""
    args = {**BASE["spec"]["task"]["args"], "stepDelay": paced(0.05)}
    training = {"steps": steps, "batchSize": 4, "logEvery": 5}
    return manifest(tmp, task={"builtin": "gpt", "args": args}, precision={"mode": "bf16"}, training=training)


def start_runner(job: Path, out: Path) -> warm.Popen:
    """`mpjob run` in the background, its output discarded."""
    return warm.Popen(
        [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}),
    )


@pytest.mark.process
def test_success_path_writes_the_status_and_a_plot(tmp_path: Path) -> None:
    job = manifest(tmp_path, precision={"mode": "bf16"})
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"), "--plain", plot=True)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["phase"] == "Succeeded" and report["step"] == 40 and len(report["attempts"]) == 1
    assert report["lastCheckpoint"]["step"] == 40
    for figure in ("loss", "samplesPerSecond"):  # to five significant digits, as a CR's status keeps them
        assert isinstance(report[figure], float) and report[figure] == round_sig(report[figure])
    assert (tmp_path / "out" / "training.png").read_bytes()[:4] == b"\x89PNG"
    assert "report: " in result.stdout and "training.png" in result.stdout


@pytest.mark.process
def test_no_plot_draws_nothing_and_the_last_line_names_only_the_report(tmp_path: Path) -> None:
    """`--no-plot` (this module's runs but the one above pass it): the run ends the same,
    series.json written, no training.png, and the summary's last JSON line names no plot;
    `mpjob status DIR --plot FILE` draws it later from its series.json."""
    job = manifest(tmp_path, precision={"mode": "bf16"}, training={"steps": 10, "batchSize": 4, "logEvery": 5})
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    last = json.loads(result.stdout.splitlines()[-1])
    assert last["phase"] == "Succeeded" and last["report"] == str(tmp_path / "out" / "report.json")
    assert "plot" not in last and "training.png" not in last["message"]
    assert (tmp_path / "out" / "series.json").exists() and not (tmp_path / "out" / "training.png").exists()
    later = subprocess.run(  # drawn later from the folder, from the series.json the run left
        [sys.executable, "-m", "mpjob.cli", "status", str(tmp_path / "out"), "--plot", str(tmp_path / "later.png")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert later.returncode == 0 and later.stdout.endswith(f"  plot: {tmp_path / 'later.png'}\n"), later
    assert (tmp_path / "later.png").read_bytes()[:4] == b"\x89PNG"


def run_overflowing(tmp_path: Path, **spec: object) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`mpjob run --json` of the fp16 job whose activations overflow at step 15; checks it
    fell back to bf16 and resumed from a checkpoint, and returns the run and its report."""
    args = {**BASE["spec"]["task"]["args"], "overflowAtStep": 15}
    job = manifest(tmp_path, task={"builtin": "gpt", "args": args}, **spec)
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    first, second = report["attempts"]
    assert (first["precision"], first["reason"]) == ("fp16", "NumericFault")
    assert (second["precision"], second["reason"]) == ("bf16", "Succeeded") and second["startStep"] > 0
    return result, report


@pytest.mark.process
def test_fallback_path_recovers_in_bf16_from_a_checkpoint(tmp_path: Path) -> None:
    result, _ = run_overflowing(tmp_path)
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert next(e for e in events if e["event"] == "precisionFallback")["toPrecision"] == "bf16"
    series = json.loads((tmp_path / "out" / "series.json").read_text())
    assert {p["precision"] for p in series["points"]} == {"fp16", "bf16"}


@pytest.mark.process
def test_a_configuration_error_fails_fast_with_the_trainers_message(tmp_path: Path) -> None:
    job = manifest(tmp_path, task={"module": "nowhere_to_be_found:make"})
    started = time.monotonic()
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"), "--plain", timeout=120)
    assert result.returncode == 1
    assert time.monotonic() - started < 60
    assert "nowhere_to_be_found" in result.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["phase"] == "Failed" and len(report["attempts"]) == 1


def test_an_invalid_manifest_is_rejected_before_running(tmp_path: Path) -> None:
    job = manifest(tmp_path, workers=0)
    result = mpjob_run(str(job), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "spec.workers" in result.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_ctrl_c_checkpoints_and_a_rerun_resumes(tmp_path: Path) -> None:
    job, out = long_bf16_job(tmp_path), tmp_path / "out"
    proc = warm.Popen(
        [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}),
    )
    wait_for(lambda: list((out / "checkpoints").glob("step-*/manifest.json")), 120, message="a checkpoint")
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output
    report = json.loads((out / "report.json").read_text())
    # As under runPolicy.suspend on a cluster: the attempt ends Suspended (one lifecycle).
    assert report["phase"] == "Suspended" and report["attempts"][0]["reason"] == "Suspended"
    stopped_at = report["attempts"][0]["endStep"]
    assert stopped_at >= 10

    again = mpjob_run(str(long_bf16_job(tmp_path, stopped_at + 10)), "--out", str(out), "--plain")
    assert again.returncode == 0, again.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["phase"] == "Succeeded"
    assert [a["precision"] for a in report["attempts"]] == ["bf16", "bf16"]
    assert report["attempts"][1]["startStep"] == stopped_at


def read_until(stream: IO[str], prefix: str) -> list[str]:
    """The lines of `stream` up to the first that starts with `prefix`, that one included."""
    lines: list[str] = []
    while not (lines and lines[-1].startswith(prefix)):
        lines.append(stream.readline())
        assert lines[-1], "".join(lines)  # it ended first
    return lines


@pytest.mark.parametrize(("hang_at", "checkpoint"), [(25, 20), (5, None)])
@pytest.mark.process
def test_a_second_ctrl_c_kills_the_trainers_and_records_only_what_was_written(
    tmp_path: Path, hang_at: int, checkpoint: int | None
) -> None:
    """Attempt 0's data loader hangs after step `hang_at` (tests/unit/localrun/stall_task.py), so
    its trainer cannot act on the first Ctrl-C: the second kills it. The attempt ends where its
    lines put it, naming the last checkpoint committed (or none), and the rerun starts there."""
    spec = {**SPEC, "runPolicy": {}}
    spec["task"] = {**SPEC["task"], "args": {**SPEC["task"]["args"], "hangAfter": {"0": hang_at * 4}}}
    job, out = manifest(tmp_path, **spec), tmp_path / "out"
    proc = warm.Popen(
        [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain", *NO_PLOT],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=warm.for_ranks({**os.environ, "OMP_NUM_THREADS": "1"}),
    )
    assert proc.stdout is not None
    shown = read_until(proc.stdout, f"step {hang_at}/")  # then its data loader hangs
    # An asynchronous save commits behind the steps (its line may never come: the hung loop no
    # longer collects it); the kill must not land while it is written, or it is rightly not named.
    wait_for(lambda: _newest_checkpoint(out) == (checkpoint or 0), 60, message=f"checkpoint {checkpoint}")
    proc.send_signal(signal.SIGINT)
    shown += read_until(proc.stdout, "interrupted:")  # the first press was taken
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(shown) + output
    assert output.startswith("second Ctrl-C: killing the trainers; no checkpoint is written now\n"), output
    report = json.loads((out / "report.json").read_text())
    (killed,) = report["attempts"]
    assert (report["step"], killed["endStep"], killed["reason"]) == (hang_at, hang_at, "Suspended")
    rerun = f"resumes from checkpoint step {checkpoint}" if checkpoint else "starts over: no checkpoint"
    assert killed["message"].startswith("killed by a second Ctrl-C") and killed["message"].endswith(rerun)
    assert report.get("lastCheckpoint", {}).get("step") == checkpoint
    for left in (out / "attempts").rglob("termination-worker*.json"):  # the launcher's line while stopping, no report
        assert TerminationReport.parse_message(left.read_text()) is None, left.read_text()

    again = mpjob_run(str(job), "--out", str(out), "--plain")
    assert again.returncode == 0, again.stdout
    said = f"from checkpoint step {checkpoint}" if checkpoint else ", starting over: no checkpoint"
    assert f"resuming local in {out}{' ' if checkpoint else ''}{said}" in again.stdout, again.stdout
    assert json.loads((out / "report.json").read_text())["attempts"][1]["startStep"] == (checkpoint or 0)


@pytest.mark.process
def test_two_local_workers_fall_back_together_and_resume(tmp_path: Path) -> None:
    """workers: 2 runs two trainer processes with gloo rendezvous on loopback: both ranks see
    the overflow at the same step, the attempt ends once, and the bf16 attempt resumes both
    from the checkpoint rank 0 wrote."""
    _, report = run_overflowing(tmp_path, workers=2)
    assert report["phase"] == "Succeeded" and report["step"] == 40
    manifests = sorted((tmp_path / "out").rglob("step-*/manifest.json"))
    assert manifests and json.loads(manifests[-1].read_text())["step"] == 40


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.process
def test_a_sigkilled_runner_takes_its_workers_with_it(tmp_path: Path) -> None:
    """Workers run in their own session (Ctrl-C reaches the runner only), so a SIGKILL of the
    runner's group does not reach them: they must die with the runner, or they train on and
    write checkpoints beside a rerun."""
    job, out = long_bf16_job(tmp_path), tmp_path / "out"
    proc = start_runner(job, out)
    wait_for(lambda: list((out / "checkpoints").glob("step-*/manifest.json")), 120, message="a checkpoint")
    workers = children(proc.pid)
    ranks = [pid for worker in workers for pid in children(worker)]
    ranks += warm.forked_for(workers + ranks)  # warm ranks: the server's children, not the stand-ins'
    assert workers and ranks, "the runner has no workers, or they have no training processes"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: all(gone(pid) for pid in workers + ranks), 30, message="the workers to die with the runner")
    # Killed, not ended: a worker that outlived the runner trained on until its output broke
    # and then wrote its termination report (and checkpoints on the way).
    assert not list((out / "attempts").rglob("termination-worker*.json"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.process
def test_a_rerun_after_a_killed_runner_records_what_the_killed_attempt_trained(tmp_path: Path) -> None:
    """The killed attempt's steps, samples and checkpoints come from what it left (its event
    lines, kept in its worker0.log); the rerun says where it really resumes; the kill is the
    user's stop, as Ctrl-C: Suspended, uncharged."""
    job, out = long_bf16_job(tmp_path), tmp_path / "out"
    proc = start_runner(job, out)
    wait_for(lambda: _newest_checkpoint(out) >= 20, 180, message="checkpoint 20")
    workers = children(proc.pid)
    ranks = [pid for worker in workers for pid in children(worker)]
    ranks += warm.forked_for(workers + ranks)  # warm ranks: the server's children, not the stand-ins'
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    wait_for(lambda: all(gone(pid) for pid in workers + ranks), 30, message="the workers to die with the runner")
    newest = _newest_checkpoint(out)
    logged = (out / "attempts" / "a0" / "worker0.log").read_text()
    assert '"event": "checkpoint"' in logged and '"event": "step"' in logged  # the event lines, not only stderr

    again = mpjob_run(str(long_bf16_job(tmp_path, newest + 10)), "--out", str(out), "--plain")
    assert again.returncode == 0, again.stdout
    assert f"from checkpoint step {newest}" in again.stdout and "start step 0" not in again.stdout, again.stdout
    killed, resumed = json.loads((out / "report.json").read_text())["attempts"]
    assert (killed["reason"], killed["charged"]) == ("Suspended", False)
    assert killed["endStep"] >= newest and killed["samples"] == killed["endStep"] * 4
    assert killed["wastedSteps"] == killed["endStep"] - newest
    assert resumed["startStep"] == newest and resumed["reason"] == "Succeeded"


def _newest_checkpoint(out: Path) -> int:
    """The step of the newest committed checkpoint in `out` (0: none yet)."""
    steps = [int(m.parent.name.split("-")[1]) for m in (out / "checkpoints").glob("step-*/manifest.json")]
    return max(steps, default=0)


@pytest.mark.process
@pytest.mark.parametrize("mode", ["--plain", "--json"])
def test_a_reader_that_stops_reading_leaves_the_run_to_end_and_be_recorded(tmp_path: Path, mode: str) -> None:
    """`mpjob run job.yaml | head -1`: the next line raised BrokenPipeError in the runner, which
    waited for its trainers to finish, then ended in a traceback with report.json still saying
    the first attempt ran at step 0."""
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(tiny_job()))
    command = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(tmp_path / "out"), mode, *NO_PLOT]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None and proc.stdout.readline()  # the first line, before any trainer starts
        proc.stdout.close()  # the reader is gone
        _, said = proc.communicate(timeout=120)
    assert proc.returncode == 0 and "Traceback" not in said and "BrokenPipe" not in said, said
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["phase"] == "Succeeded" and report["step"] == 2
