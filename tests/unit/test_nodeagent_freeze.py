"""A silenced test node stops its pods' processes where they stand (tests/cluster/nodeagent/
freeze.py): the container's whole process tree, though the launcher's ranks run in sessions of
their own, and the rank a warm-start server forked for a stand-in, which is no descendant."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.nodeagent.freeze import processes, signal_all
from tests.helpers import wait_for
from tests.warm import rules

pytestmark = pytest.mark.unit

#: A container: it starts a rank in a session of its own, prints the rank's pid, and waits.
CONTAINER = (
    "import subprocess, sys, time\n"
    "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
    "print(rank.pid, flush=True)\n"
    "time.sleep(120)\n"
)


def state(pid: int) -> str:
    """The process's state letter (/proc/PID/stat): T when stopped."""
    fields = rules.proc_stat(pid)
    assert fields is not None, pid
    return fields[0]


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_silent_nodes_pod_is_stopped_whole_and_goes_on_when_continued(
    tmp_path: Path, started: list[subprocess.Popen[str]]
) -> None:
    container = subprocess.Popen([sys.executable, "-c", CONTAINER], stdout=subprocess.PIPE, text=True)
    started.append(container)
    assert container.stdout is not None
    rank = int(container.stdout.readline())
    forked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], text=True)  # a warm rank
    started.append(forked)
    wait_for(lambda: rules.started_at(rank) is not None, 60, message="the rank")
    record = rules.rank_record(str(tmp_path), rank)
    record.parent.mkdir(parents=True)
    record.write_text(f"{forked.pid} {rules.started_at(rank)}")  # as a stand-in names its rank

    pids = processes(container.pid, tmp_path)
    assert set(pids) == {container.pid, rank, forked.pid}
    signal_all(pids, signal.SIGSTOP)
    wait_for(lambda: all(state(p) == "T" for p in pids), 60, message="all stopped")
    signal_all(pids, signal.SIGCONT)
    wait_for(lambda: all(state(p) != "T" for p in pids), 60, message="all going on")
    record.write_text(f"{forked.pid} 1")  # a stale record (another process's start time) names none
    assert set(processes(container.pid, tmp_path)) == {container.pid, rank}
    signal_all([rank], signal.SIGKILL)  # no child of ours: the fixture does not reach it
