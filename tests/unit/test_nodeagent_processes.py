"""The test node never signals a container's process group once it has reaped the container:
process numbers wrap here (pid_max 32768) and the suite starts thousands of processes, so the
number may be another process group's by then (an operator, a test's own server). A pod deleted
again with a shorter grace period gets its SIGKILL sooner, as from a kubelet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.cluster.nodeagent.processes import ProcessRuntime
from tests.cluster.nodeagent.state import PodProcess

pytestmark = pytest.mark.unit


def record(tmp_path: Path, pid: int) -> PodProcess:
    exit_file = tmp_path / "exit"
    return PodProcess(
        uid="u", namespace="ns", name="pod", pid=pid, ip="10.0.0.2", pod_dir=str(tmp_path), container="c",
        exit_file=str(exit_file), term_file=str(tmp_path / "term"), log_file=str(tmp_path / "log"), started_at="",
    )  # fmt: skip


def test_a_reaped_containers_number_is_never_signalled_again(tmp_path: Path) -> None:
    runtime = ProcessRuntime(core=None, logs_dir=tmp_path)
    ended = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    runtime.procs[ended.pid] = ended
    rec = record(tmp_path, ended.pid)
    (tmp_path / "exit").write_text("0")
    ended.wait()
    assert runtime.exited(rec) == 0  # reaped here
    # Its number now names a stranger's process group (as a wrapped pid would).
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        reused = record(tmp_path, stranger.pid)
        runtime.reaped.add(stranger.pid)  # the number the runtime reaped, now the stranger's
        assert runtime.exited(reused) == 0 and runtime.kill(reused, grace=0.1) == 0
        assert stranger.poll() is None, "the stranger was signalled"
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()


def test_a_deletion_with_a_shorter_grace_brings_the_sigkill_forward(tmp_path: Path) -> None:
    runtime = ProcessRuntime(core=None, logs_dir=tmp_path)
    deaf = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", deaf], start_new_session=True, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline()  # SIGTERM is ignored from here on
    runtime.procs[proc.pid] = proc
    rec, codes = record(tmp_path, proc.pid), []
    stopping = threading.Thread(target=lambda: codes.append(runtime.kill(rec, grace=600)))
    try:
        stopping.start()
        stopping.join(0.5)
        assert stopping.is_alive() and proc.poll() is None, "the deaf container outlives its SIGTERM"
        runtime.shorten(rec, grace=0.2)
        stopping.join(30)
        assert codes == [137] and proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        stopping.join(30)
