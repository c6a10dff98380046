"""The test control plane restarts a killed process, as a kubelet restarts static pods: a
`kill -9` of etcd or the apiserver is a restart with the cluster's state intact (what
bench/chaos.py relies on), and a component that keeps dying at start is given up on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from tests.cluster.controlplane import Layout, api_ready, running
from tests.cluster.supervise import supervise
from tests.helpers import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]
#: A control plane of this module's own: killing the shared one's etcd or apiserver would fail
#: the tests that other workers run on it meanwhile. Its ports and pod IPs are its own too.
PORT_BASE = 19380


@pytest.fixture(scope="module")
def local_layout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    if os.environ.get("KUBECONFIG"):
        pytest.skip("needs the test control plane (not a cluster named by $KUBECONFIG)")
    layout = Layout(tmp_path_factory.mktemp("restarts") / "cluster", PORT_BASE)
    env = {**os.environ, "MPJOB_CLUSTER_DIR": str(layout.root), "MPJOB_CLUSTER_PORT_BASE": str(PORT_BASE)}
    env["MPJOB_TEST_COLD"] = "1"  # no warm-start servers (torch and the frameworks imported): no rank runs here

    def cluster(command: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tests.cluster", command]
        return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)

    started = cluster("up")
    assert started.returncode == 0, started.stderr
    yield layout
    cluster("down")


@pytest.fixture(scope="module")
def core(local_layout: Layout) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(local_layout.kubeconfig)))


@pytest.mark.parametrize("component", ["etcd", "kube-apiserver"])
def test_a_killed_control_plane_process_comes_back_with_the_state(
    local_layout: Layout, core: client.CoreV1Api, component: str
) -> None:
    name = f"restart-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_config_map("default", {"metadata": {"name": name}, "data": {"k": "v"}})
    supervisor = running(local_layout)[component]
    child = int(local_layout.child_pidfile(component).read_text())
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: int(local_layout.child_pidfile(component).read_text()) != child, 30, 0.1, "a new process")
    wait_for(lambda: api_ready(local_layout, timeout=2), 120, 0.2, f"the API back after killing {component}")
    assert running(local_layout)[component] == supervisor, "the same supervisor restarted it"
    config_map = wait_for(lambda: core.read_namespaced_config_map(name, "default"), 60, 0.5, "the API answering")
    assert config_map.data == {"k": "v"}
    core.delete_namespaced_config_map(name, "default")


def test_a_process_that_keeps_dying_at_start_is_given_up(tmp_path: Path) -> None:
    started = time.monotonic()
    code = supervise(tmp_path / "child.pid", [sys.executable, "-c", "import sys; sys.exit(3)"])
    assert code == 3 and time.monotonic() - started < 30
    assert int((tmp_path / "child.pid").read_text()) > 0
