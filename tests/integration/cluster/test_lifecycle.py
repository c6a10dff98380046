"""`make cluster` / `make cluster-down` on a second, private instance: idempotent start,
nothing left behind, a clear line when a port is taken, and an agent restart that
re-adopts running pods."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.cluster.controlplane import COMPONENTS, Layout, pid_alive, read_pid
from tests.helpers import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def private(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {**os.environ, "MPJOB_CLUSTER_DIR": str(tmp_path / "cluster"), "MPJOB_CLUSTER_PORT_BASE": "17380"}
    env["MPJOB_TEST_COLD"] = "1"  # no warm-start servers (torch and the frameworks imported): no rank runs here
    env.pop("KUBECONFIG", None)
    yield env
    subprocess.run([sys.executable, "-m", "tests.cluster", "down"], env=env, cwd=REPO, capture_output=True)


def _cluster(env: dict[str, str], command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.cluster", command], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )


def test_up_twice_is_idempotent_and_down_leaves_no_process(private: dict[str, str]) -> None:
    first = _cluster(private, "up")
    assert first.returncode == 0, first.stderr
    layout = Layout(Path(private["MPJOB_CLUSTER_DIR"]), 17380)
    pids = {c: read_pid(layout, c) for c in (*COMPONENTS, "s3")}  # the S3 server starts with it
    assert all(pid and pid_alive(pid) for pid in pids.values()), pids

    second = _cluster(private, "up")
    assert second.returncode == 0 and "already running" in second.stdout
    assert {c: read_pid(layout, c) for c in (*COMPONENTS, "s3")} == pids  # nothing restarted

    down = _cluster(private, "down")
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in pids.values() if pid and pid_alive(pid)]


def test_port_in_use_gives_one_clear_line(private: dict[str, str]) -> None:
    with socket.socket() as blocker:
        # The cluster the test before stopped may leave connections to this port in TIME_WAIT:
        # they do not hold it, but a bind without SO_REUSEADDR would fail on them.
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        blocker.bind(("127.0.0.1", 17380 + 63))  # the apiserver's port for base 17380
        blocker.listen()
        result = _cluster(private, "up")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "port 17443 (kube-apiserver)" in lines[0] and "MPJOB_CLUSTER_PORT_BASE" in lines[0]
    assert "Traceback" not in result.stderr


def test_restarted_agent_readopts_running_pods(private: dict[str, str]) -> None:
    assert _cluster(private, "up").returncode == 0
    layout = Layout(Path(private["MPJOB_CLUSTER_DIR"]), 17380)
    core = client.CoreV1Api(config.new_client_from_config(str(layout.kubeconfig)))
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "survivor"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "python",
                        "command": [sys.executable, "-c", "import time, pathlib; time.sleep(4); raise SystemExit(7)"],
                    }
                ],
            },
        },
    )
    wait_for(
        lambda: core.read_namespaced_pod("survivor", "default").status.phase == "Running",
        60,
        message="survivor running",
    )
    agent = read_pid(layout, "node-agent")
    assert agent
    os.killpg(agent, signal.SIGKILL)
    wait_for(lambda: not pid_alive(agent), 60, message="agent gone")
    # Start a new agent the way `up` does (up restarts everything when a component is missing).
    log = (layout.logs / "node-agent.log").open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.cluster.nodeagent",
            "--kubeconfig",
            str(layout.kubeconfig),
            "--state-dir",
            str(layout.root),
        ],
        cwd=REPO,
        stdout=log,
        stderr=log,
        start_new_session=True,
        env={**private, "PYTHONPATH": str(REPO)},
    )
    layout.pidfile("node-agent").write_text(str(proc.pid))

    def terminated() -> int | None:
        statuses = core.read_namespaced_pod("survivor", "default").status.container_statuses or []
        state = statuses[0].state if statuses else None
        return state.terminated.exit_code if state and state.terminated else None

    started = time.monotonic()
    assert wait_for(terminated, 60, message="survivor's exit seen by the new agent") == 7
    assert time.monotonic() - started < 60
