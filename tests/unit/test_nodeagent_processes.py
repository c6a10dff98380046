"""The test node never signals a container's process group once it has reaped the container:
process numbers wrap here (pid_max 32768) and the suite starts thousands of processes, so the
number may be another process group's by then (an operator, a test's own server)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.nodeagent.environment import kubelet_expand
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


@pytest.mark.parametrize(
    ("text", "handed"),
    [("a$$b", "a$b"), ("$(X)/y", "1/y"), ("$(Y)", "$(Y)"), ("$$(X)", "$(X)"), ("$x $(", "$x $(")],
)
def test_the_agent_expands_env_values_as_the_kubelet_does(text: str, handed: str) -> None:
    assert kubelet_expand(text, {"X": "1"}) == handed
