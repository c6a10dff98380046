"""The operator's metrics endpoint stops with the operator: `mpjob operator`, which starts
prometheus_client's HTTP server before kopf runs, shuts it down and joins its thread once kopf
has returned or failed, whatever happened (a thread of ours still running Python as the
interpreter finalizes can abort the process). kopf's cleanup stops the other parts first: a
scrape reads them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from mpjob.controller.main import serve_metrics
from tests.helpers import free_port
from tests.unit.operator.fake_apiserver import NAMESPACE, HalfCluster, serve

pytestmark = pytest.mark.unit

#: `mpjob operator` whose kopf fails before the Controller is assembled (kopf then runs no
#: cleanup), the endpoint read once from inside that start; it prints, as JSON, what failed,
#: what had served, and what is left of the endpoint once `main` has returned or raised.
FAILS_BEFORE_ASSEMBLE = """
import json, socket, sys, threading, urllib.request
import kopf
from mpjob.controller import handlers, main
port, served = int(sys.argv[1]), []
def refused(cls, *args):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        served.append(b"mpjob_" in answer.read())
    raise kopf.PermanentError("no Controller: kopf failed before it was assembled")
handlers.Controller.assemble = classmethod(refused)
try:
    main.main(["-n", sys.argv[2], "--metrics-port", str(port), "--bind-address", "127.0.0.1", "--health-port", "0"])
    failed = None
except Exception as exc:
    failed = type(exc).__name__
alive = [t.name for t in threading.enumerate() if t.name == "mpjob-metrics"]
try:
    socket.create_connection(("127.0.0.1", port), timeout=10).close()
    listening = True
except ConnectionRefusedError:
    listening = False
print(json.dumps({"failed": failed, "served": served, "alive": alive, "listening": listening}), flush=True)
"""


def test_a_kopf_that_fails_before_the_controller_exists_leaves_no_metrics_server(tmp_path: Path) -> None:
    port = free_port()
    with serve(HalfCluster(), tmp_path) as kubeconfig:
        env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": str(kubeconfig), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        done = subprocess.run(
            [sys.executable, "-c", FAILS_BEFORE_ASSEMBLE, str(port), NAMESPACE],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["failed"], seen["served"]) == ("ActivityError", [True]), done.stderr[-3000:]
    assert seen["alive"] == [] and seen["listening"] is False, seen


def test_a_stopped_metrics_server_has_closed_its_port_and_joined_its_thread() -> None:
    port = free_port()
    metrics, refused = serve_metrics(port, "127.0.0.1")
    assert refused is None and metrics is not None
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert answer.status == 200 and b"# TYPE" in answer.read()
    assert metrics.stop(5.0) == []
    assert not metrics.thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=30).close()
    assert metrics.stop(1.0) == []  # a second stop does nothing more


def test_metrics_port_0_serves_nothing() -> None:
    assert serve_metrics(0, "127.0.0.1") == (None, None)
