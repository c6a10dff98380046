"""`mpjob run` of a command that cannot start, or that raises at the same step whatever the
attempt: the job fails in two attempts with the cause in its status message (the launcher
quotes the rank's stderr; the planner stops the second identical failure at the same step),
in one when python's script is not there (a configuration error);
and a command's `python` is `mpjob run`'s own interpreter, so `mpjob run` called by its path,
its environment not on PATH, still works."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from mpjob.localrun.cli import run_command

pytestmark = pytest.mark.unit

MPJOB = Path(sys.executable).with_name("mpjob")


def run(
    tmp: Path, command: list[str], *, env: dict[str, str] | None = None, every: int | None = None
) -> tuple[int, dict[str, Any], str]:
    """`mpjob run` (by its path) of a task.command job in `tmp` (a checkpoint `every` steps); its
    exit code, report.json, output."""
    result = subprocess.run(
        mpjob_run(tmp, command, every=every),
        capture_output=True,
        text=True,
        timeout=300,
        env=env or {**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return result.returncode, json.loads((tmp / "out" / "report.json").read_text()), result.stdout + result.stderr


def mpjob_run(tmp: Path, command: list[str], *, every: int | None = None) -> list[str]:
    """The command line of `mpjob run` (by its path) of a task.command job written to `tmp`."""
    doc: dict[str, Any] = {
        "apiVersion": "mpjob.dev/v1alpha1",
        "kind": "MixedPrecisionJob",
        "metadata": {"name": "own"},
        "spec": {
            "task": {"command": command},
            "training": {"steps": 10, "batchSize": 4, "logEvery": 5},
            "precision": {"mode": "fp32"},
            "resources": {"gpusPerWorker": 0},
            "runPolicy": {"maxAttempts": 6},
        },
    }
    if every is not None:
        doc["spec"]["checkpoint"] = {"everySteps": every}
    (tmp / "job.yaml").write_text(yaml.safe_dump(doc))
    return [str(MPJOB), "run", str(tmp / "job.yaml"), "--out", str(tmp / "out"), "--plain"]


CANNOT_START = {
    "a script that does not parse": ("def (\n", "SyntaxError"),
    "a module that fails to import": ("import mpjob_no_such_module_for_tests\n", "ModuleNotFoundError"),
}


@pytest.mark.process
@pytest.mark.parametrize(("source", "cause"), CANNOT_START.values(), ids=CANNOT_START.keys())
def test_a_command_that_cannot_start_fails_in_two_attempts_with_its_cause(
    tmp_path: Path, source: str, cause: str
) -> None:
    (tmp_path / "train.py").write_text(source)
    code, report, said = run(tmp_path, ["python", "train.py"])
    assert code != 0, said
    assert report["phase"] == "Failed", said
    assert len(report["attempts"]) == 2, report["attempts"]
    assert cause in report["message"], report["message"]
    assert "before their first step" in report["message"]
    failed = next(c for c in report["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailedBeforeFirstStep" and cause in failed["message"]


@pytest.mark.process
def test_a_script_that_does_not_exist_fails_in_one_attempt_as_a_configuration_error(tmp_path: Path) -> None:
    """python's "can't open file" (exit 2, no report) was an infrastructure failure: the job was
    retried once before the planner stopped it. No retry can make the file appear."""
    code, report, said = run(tmp_path, ["python", "train.py"])
    assert code != 0 and report["phase"] == "Failed", said
    [only] = report["attempts"]
    assert (only["reason"], only["exitCode"]) == ("ConfigError", 43), only
    assert f"its script 'train.py' does not exist (working directory: {tmp_path})" in only["message"], only
    assert "task.command [" in only["message"] and "'train.py'" in report["message"], report["message"]


@pytest.mark.process
def test_the_attempt_after_a_failure_waits_its_backoff_and_says_so_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPJOB_ATTEMPT_BACKOFF_SECONDS": "2"}
    (tmp_path / "train.py").write_text("def (\n")  # attempt 0 cannot start: a SyntaxError
    code, report, said = run(tmp_path, ["python", "train.py"], env=env)
    first, second = report["attempts"]
    assert code != 0 and said.count("attempt 0 failed (InfraError: ") == 1, said
    assert "; attempt 1 starts in 2s, at " in said, said
    waited = datetime.fromisoformat(second["startTime"]) - datetime.fromisoformat(first["finishTime"])
    assert waited >= timedelta(seconds=2), (first, second)


@pytest.mark.process
def test_the_job_deadline_passing_during_a_backoff_fails_the_run_without_starting_the_attempt(tmp_path: Path) -> None:
    """runPolicy.activeDeadlineSeconds passing while the attempt after a failure waits its backoff
    (minutes here) ends the run then, DeadlineExceeded, the attempt never started: as the operator
    fails the job at its deadline without making the attempt's Job."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPJOB_ATTEMPT_BACKOFF_SECONDS": "300"}
    (tmp_path / "train.py").write_text("def (\n")  # attempt 0 cannot start: a SyntaxError
    argv = mpjob_run(tmp_path, ["python", "train.py"])
    doc = yaml.safe_load((tmp_path / "job.yaml").read_text())
    doc["spec"]["runPolicy"]["activeDeadlineSeconds"] = 20
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(doc))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)  # the wait had 300 s
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failed, due = report["attempts"]
    assert result.returncode != 0 and report["phase"] == "Failed", result.stdout + result.stderr
    assert (failed["reason"], due["reason"]) == ("InfraError", "DeadlineExceeded"), report["attempts"]
    ended = datetime.fromisoformat(report["completionTime"]) - datetime.fromisoformat(report["startTime"])
    assert timedelta(seconds=20) <= ended < timedelta(seconds=60), report
    assert not (tmp_path / "out" / "attempts" / "a1").exists()  # never started


def lines_until(said: queue.Queue[str], wanted: str, seconds: float) -> list[str]:
    """The lines `mpjob run` printed up to the first one that holds `wanted`, read within `seconds`."""
    lines: list[str] = []
    deadline = time.monotonic() + seconds
    while not lines or wanted not in lines[-1]:
        lines.append(said.get(timeout=max(0.0, deadline - time.monotonic())))
    return lines


@pytest.mark.process
def test_ctrl_c_during_the_backoff_suspends_the_run_at_once_and_a_rerun_resumes(tmp_path: Path) -> None:
    """Ctrl-C while the attempt after a failure waits its backoff (minutes here) ends the run at
    once, Suspended (exit 130), that attempt recorded as stopped before it started; the rerun starts
    its next attempt at once: a suspension is no failure to back off from."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPJOB_ATTEMPT_BACKOFF_SECONDS": "300"}
    (tmp_path / "train.py").write_text("def (\n")  # attempt 0 cannot start: a SyntaxError
    argv = mpjob_run(tmp_path, ["python", "train.py"])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    said: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [said.put(line.rstrip("\n")) for line in proc.stdout or ()], daemon=True)
    reader.start()
    try:
        before = lines_until(said, "; attempt 1 starts in 300s, at ", 120)
        pressed = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)  # the wait had 300 s to go
    finally:
        proc.kill()
    took = time.monotonic() - pressed
    reader.join(timeout=30)
    after = list(said.queue)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    failed, held = report["attempts"]
    assert code == 130 and report["phase"] == "Suspended", (before, after)
    assert took < 30 and "interrupted: stopping before the next attempt starts" in after, after
    assert (failed["reason"], held["reason"]) == ("InfraError", "Suspended"), report["attempts"]
    assert held["message"].startswith("stopped by Ctrl-C before it started; a rerun with the same --out "), held
    assert not any(line.startswith("attempt 1: ") for line in after), after  # its started line
    assert not (tmp_path / "out" / "attempts" / "a1").exists()
    (tmp_path / "train.py").write_text("pass\n")
    code, report, rerun = run(tmp_path, ["python", "train.py"], env=env)
    assert code == 0 and report["phase"] == "Succeeded", rerun
    assert "resuming own in " in rerun and " starts in " not in rerun, rerun  # no backoff after a suspension
    assert [a["reason"] for a in report["attempts"]] == ["InfraError", "Suspended", "Succeeded"]


RAISES_AT_STEP_7 = """
import torch
from mpjob_trainer import session as mpjob

with mpjob.start() as run:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = run.resume(model=model, optimizer=optimizer)
    for step in range(start, run.total_steps):
        if step + 1 == 7:
            raise KeyError("labels")  # what the data holds at step 7, whatever the attempt
        with run.autocast():
            loss = model(torch.randn(4, 4)).square().mean()
        run.backward(loss)
        run.step(optimizer)
        run.end_step(step + 1, loss=loss, samples=4)
"""


@pytest.mark.process
def test_a_script_that_raises_at_the_same_step_again_fails_in_two_attempts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RAISES_AT_STEP_7)
    code, report, said = run(tmp_path, ["python", "train.py"], every=4)
    assert code != 0, said
    assert report["phase"] == "Failed", said
    assert len(report["attempts"]) == 2, (report["attempts"], said)  # what differed, if a third ran
    first, second = report["attempts"]
    assert (first["startStep"], first["endStep"]) == (0, 6), first
    assert (second["startStep"], second["endStep"]) == (4, 6), second  # resumed from step 4, raised again
    failed = next(c for c in report["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "FailedAtTheSameStep", failed
    assert "at step 6" in failed["message"] and "KeyError: 'labels'" in failed["message"]
    # the session's own message, the script's line named (the launcher put "exited 1 (its report
    # said InfraError)" in its place)
    assert "KeyError: 'labels' (raised at train.py:11 in <module>)" in first["message"], first
    assert "its report said" not in said


@pytest.mark.process
def test_a_commands_python_is_mpjob_runs_own_interpreter(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import sys\nopen('interpreter', 'w').write(sys.executable)\n")
    bare = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"}
    code, report, said = run(tmp_path, ["python", "train.py"], env=bare)
    assert code == 0 and report["phase"] == "Succeeded", said
    assert (tmp_path / "interpreter").read_text() == sys.executable


def _write_job(folder: Path, *, working_dir: str) -> None:
    """job.yaml in `folder`: `python train.py` in `working_dir`, two steps on the CPU."""
    task = {"command": ["python", "train.py"], "workingDir": working_dir}
    spec = {"task": task, "training": {"steps": 2}, "resources": {"gpusPerWorker": 0}}
    doc = {"apiVersion": "mpjob.dev/v1alpha1", "kind": "MixedPrecisionJob", "metadata": {"name": "own"}, "spec": spec}
    (folder / "job.yaml").write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize("where", ["no-such-folder", "train.py"], ids=["missing", "a-file"])
def test_a_working_dir_that_is_no_folder_is_refused_before_the_run(
    tmp_path: Path, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task.workingDir below the manifest's folder that is no folder there ended `mpjob run` in a
    traceback once the first attempt's workers were started, its report left Running."""
    (tmp_path / "train.py").write_text("pass\n")
    _write_job(tmp_path, working_dir=where)
    out = tmp_path / "out"
    assert run_command([str(tmp_path / "job.yaml"), "--out", str(out), "--json"]) == 2
    said = json.loads(capsys.readouterr().out)
    assert said["event"] == "error" and said["field"] == "spec.task.workingDir", said
    assert f"{tmp_path / where} is not a folder" in said["message"], said
    assert not out.exists()  # refused before anything was written


@pytest.mark.process
def test_a_working_dir_gone_before_the_next_attempt_ends_it_as_a_configuration_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first attempt's command deletes its workingDir and fails: the next attempt cannot
    start there. It ended `mpjob run` in Popen's traceback, its report left Running."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("import os, shutil, sys\nshutil.rmtree(os.getcwd())\nsys.exit(1)\n")
    _write_job(tmp_path, working_dir="work")
    out = tmp_path / "out"
    assert run_command([str(tmp_path / "job.yaml"), "--out", str(out), "--json", "--no-plot"]) == 1
    report = json.loads((out / "report.json").read_text())
    first, second = report["attempts"]
    assert first["reason"] == "InfraError" and second["reason"] == "ConfigError", report["attempts"]
    assert f"spec.task.workingDir: {work} is not a folder" in second["message"]
    assert report["phase"] == "Failed" and f"{work} is not a folder" in report["message"]
    assert "Traceback" not in capsys.readouterr().err
