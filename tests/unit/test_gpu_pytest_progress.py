"""The GPU check's pytest step, test by test (scripts/gpu/pytest_progress.py): a real pytest,
with and without xdist workers, stopped the way a step out of its budget is (its process group
killed), still says what passed, failed and skipped, and names the test that was running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.gpu import runner, steps
from scripts.gpu.pytest_progress import events, progress
from tests.helpers import wait_for

pytestmark = pytest.mark.unit

TESTS = """
import pytest, time

def test_passes():
    time.sleep(0.5)
def test_fails(): assert False
@pytest.mark.skip(reason="not here")
def test_skipped(): pass
def test_hangs():
    time.sleep(120)
"""


def finished(log: Path, test: str) -> bool:
    return any(e["event"] == "report" and e["test"].endswith(test) and e["when"] == "teardown" for e in events(log))


def started(log: Path, test: str) -> bool:
    return any(e["event"] == "start" and e["test"].endswith(test) for e in events(log))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stopped_run_counts_what_finished_and_names_what_was_running(tmp_path: Path, workers: int) -> None:
    (tmp_path / "test_story.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "progress.jsonl"
    xdist = ["-n", str(workers), "--dist", "loadfile"] if workers else ["-p", "no:xdist"]
    argv = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "-p", "scripts.gpu.pytest_progress",
            f"--progress-log={log}", *xdist, str(tmp_path / "test_story.py")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(runner.REPO)}
    proc = subprocess.Popen(argv, cwd=runner.REPO, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: log.exists() and started(log, "test_hangs"), timeout=60, message="test_hangs started")
        assert all(finished(log, t) for t in ("test_passes", "test_fails", "test_skipped")), events(log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    found = progress(log)
    assert {k: found[k] for k in ("tests", "passed", "failures", "errors", "skipped", "unfinished", "notStarted")} == {
        "tests": 4, "passed": 1, "failures": 1, "errors": 0, "skipped": 1, "unfinished": 1, "notStarted": 0
    }  # fmt: skip
    assert [t.split("::")[-1] for t in found["failedTests"]] == ["test_fails"]
    assert len(found["unfinishedTests"]) == 1 and "test_story.py::test_hangs: started at" in found["unfinishedTests"][0]
    slowest, seconds = found["slowestTests"][0].split("::")[-1].split(": ")
    assert slowest == "test_passes" and float(seconds.removesuffix(" s")) >= 0.5  # setup, call and teardown


@pytest.mark.parametrize("workers", [0, 2])
def test_a_test_file_that_does_not_import_is_named(tmp_path: Path, workers: int) -> None:
    (tmp_path / "test_fine.py").write_text("def test_fine(): pass\n")
    (tmp_path / "test_broken.py").write_text("from nowhere import nothing\n\ndef test_never(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "progress.jsonl"
    xdist = ["-n", str(workers)] if workers else ["-p", "no:xdist"]
    argv = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "-p", "scripts.gpu.pytest_progress",
            f"--progress-log={log}", *xdist, str(tmp_path)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(runner.REPO)}
    out = subprocess.run(argv, cwd=runner.REPO, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0, out.stdout[-2000:]
    assert [Path(name).name for name in progress(log)["collectErrors"]] == ["test_broken.py"]


def test_tests_never_started_are_counted_and_a_torn_last_line_is_left_out(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    lines = [
        '{"event": "collected", "t": 0.1, "tests": ["a.py::one", "a.py::two", "a.py::three"]}',
        '{"event": "start", "t": 0.2, "test": "a.py::one"}',
        *(
            f'{{"event": "report", "t": 0.3, "test": "a.py::one", "when": "{when}", "outcome": "passed", "seconds": 1}}'
            for when in ("setup", "call", "teardown")
        ),
        '{"event": "start", "t": 3.5, "test": "a.py::two"}',
        '{"event": "report", "t": 3.6, "test": "a.py::two", "when": "setup", "outcome": "failed", "seconds": 0.5}',
        '{"event": "report", "t": 3.7, "test": "a.py::two", "when": "teard',
    ]
    log.write_text("\n".join(lines))
    found = progress(log)
    assert (found["tests"], found["passed"], found["errors"], found["notStarted"]) == (3, 1, 1, 1)
    assert found["failedTests"] == ["a.py::two"] and found["slowestTests"] == ["a.py::one: 3 s", "a.py::two: 0.5 s"]


def test_the_gpu_step_runs_pytest_with_the_progress_log_and_reads_it_back(tmp_path: Path) -> None:
    ctx = runner.Context(work=tmp_path)
    argv = steps.pytest_command(ctx)
    log = tmp_path / "pytest" / "progress.jsonl"
    assert argv[argv.index("-p", argv.index("-v")) + 1] == "scripts.gpu.pytest_progress"
    assert f"--progress-log={log}" in argv
    assert steps.pytest_result(ctx) == ({}, "no progress log written")
    log.write_text('{"event": "collected", "t": 0.1, "tests": ["a.py::one"]}\n')
    figures, problem = steps.pytest_result(ctx)
    assert figures["notStarted"] == 1 and problem == "1 of 1 never finished"
    with log.open("a") as sink:
        sink.write('{"event": "collectError", "t": 0.2, "test": "tests/test_x.py"}\n')
    assert steps.pytest_result(ctx)[1] == "not collected: tests/test_x.py"
