"""`mpjob operator` refuses bad flags before it touches a cluster, naming the flag, and a missing
or unreachable cluster at once, in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.operator.fake_apiserver import HalfCluster, serve

pytestmark = pytest.mark.unit


def test_a_bad_priority_is_refused_naming_the_flag() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "operator", "--priority", "newest"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nonexistent"},
    )
    assert result.returncode == 2
    assert "--priority: an integer or 'oldest', not 'newest'" in result.stderr


CLOSED_PORT_KUBECONFIG = (
    "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
    "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
    "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
)


@pytest.mark.parametrize(
    ("kubeconfig", "said"),
    [
        (None, "error: no usable kubeconfig (Invalid kube-config file. No configuration found.)"),
        (CLOSED_PORT_KUBECONFIG, "error: cannot reach the cluster at https://127.0.0.1:9: MaxRetryError"),
        ("\xff\xfe not text", "error: no usable kubeconfig (not UTF-8 text (byte 0))"),
    ],
    ids=["no-kubeconfig", "closed-port", "not-text"],
)
def test_without_a_cluster_the_operator_says_so_in_one_line_and_ends(
    tmp_path: Path, kubeconfig: str | None, said: str
) -> None:
    """Not a traceback, nor watches retried forever (it outlived SIGTERM so): one line, exit 1."""
    path = tmp_path / "kubeconfig"
    if kubeconfig is not None:
        path.write_bytes(kubeconfig.encode("latin-1"))
    result = subprocess.run(
        [sys.executable, "-m", "mpjob.cli", "operator"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "KUBECONFIG": str(path), "PYTHONPATH": os.environ.get("PYTHONPATH", "")},
    )
    assert (result.returncode, result.stdout.strip()) == (1, said), result.stderr
    assert "Traceback" not in result.stderr


def test_the_operator_logs_each_line_once() -> None:
    """kopf's own handler beside the operator's printed every line twice, in two formats."""
    script = (
        "import logging; from mpjob.controller.main import configure_logging; configure_logging(verbose=False); "
        "logging.getLogger('mpjob.operator').warning('said once'); logging.getLogger('kopf.objects').info('kopf too')"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    lines = result.stderr.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "WARNING mpjob.operator said once",
        "INFO kopf.objects kopf too",
    ]


@pytest.fixture
def answering_cluster(tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of a cluster that answers (/version; the operator fails before it lists)."""
    with serve(HalfCluster(), tmp_path) as path:
        yield path


def test_a_metrics_port_in_use_is_said_in_one_line(answering_cluster: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "mpjob.cli", "operator", "--metrics-port", str(port), "--bind-address", "127.0.0.1"],
            capture_output=True,
            text=True,
            timeout=30,
            env={
                "PATH": "/usr/bin:/bin",
                "KUBECONFIG": str(answering_cluster),
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
        )
    said = f"error: --metrics-port {port}: cannot listen on 127.0.0.1 (Address already in use)"
    assert (result.returncode, result.stdout.strip()) == (1, said), result.stderr
    assert "Traceback" not in result.stderr
