"""`mpjob operator` against a cluster that is only half there: an API server that answers
/version but refuses (403) or never answers the rest. The operator stops promptly, exit 0, on
SIGTERM or SIGINT at every stage of its start; says once why its cache cannot list, naming the
resource and the RBAC to grant; retries with backoff, not once a second; keeps /healthz down
until its cache has synced; and a health port it cannot listen on is one line and exit 1."""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mpjob.controller.cluster import REQUEST_TIMEOUT
from tests.helpers import free_port, wait_for
from tests.unit.operator.fake_apiserver import FORBIDDEN, NAMESPACE, HalfCluster, serve

pytestmark = pytest.mark.unit

#: How long a stop may take on a starved 2-core machine (kopf's own shutdown included).
STOP_SECONDS = 30
JOBS = f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs"
CRD = "/apis/apiextensions.k8s.io/"
REQUEST_READ_SECONDS = REQUEST_TIMEOUT[1]


@dataclass
class Operator:
    process: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Send `signum`; the exit code, or a failure when it outlives STOP_SECONDS."""
        self.process.send_signal(signum)
        try:
            return self.process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still running {STOP_SECONDS} s after {signum!r}:\n{self.text()[-3000:]}") from None


@pytest.fixture
def forbidding() -> HalfCluster:
    return HalfCluster()


@pytest.fixture
def kubeconfig(forbidding: HalfCluster, tmp_path: Path) -> Iterator[Path]:
    with serve(forbidding, tmp_path) as path:
        yield path


@contextlib.contextmanager
def start(kubeconfig: Path, tmp_path: Path, *flags: str) -> Iterator[Operator]:
    log = tmp_path / "operator.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mpjob.cli", "operator", "-n", NAMESPACE, "--metrics-port", "0", *flags],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={
                "PATH": "/usr/bin:/bin",
                "KUBECONFIG": str(kubeconfig),
                "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            },
        )
    try:
        yield Operator(process, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def healthz(port: int) -> int | None:
    """The status /healthz answers on `port`, None when nothing listens there."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status
    except ConnectionRefusedError:
        return None
    finally:
        connection.close()


def test_a_forbidden_cache_is_said_once_retried_with_backoff_and_stopped_by_sigterm(
    kubeconfig: Path, forbidding: HalfCluster, tmp_path: Path
) -> None:
    health = free_port()
    with start(kubeconfig, tmp_path, "--health-port", str(health), "--bind-address", "127.0.0.1") as operator:
        first = wait_for(lambda: forbidding.requests(JOBS)[:1], timeout=60, message="the cache's listing of jobs")[0]
        window = 10.0
        wait_for(lambda: time.monotonic() > first + window, timeout=window + 5, message="the end of the window")
        listings = [t for t in forbidding.requests(JOBS) if t <= first + window]
        assert 2 <= len(listings) <= 5, f"{len(listings)} listings of jobs in {window} s: {listings}"
        assert healthz(health) in (None, 500), "/healthz answered before the cache synced"
        said = [line for line in operator.text().splitlines() if "listing jobs.batch" in line]
        assert len(said) == 1, said
        assert f"listing jobs.batch in namespace {NAMESPACE}: 403 Forbidden: {FORBIDDEN}" in said[0]
        assert "helm/mpjob/templates" in said[0] and "list and watch" in said[0]
        assert operator.stop(signal.SIGTERM) == 0, operator.text()[-3000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_the_cache_waits_to_sync_ends_the_operator_at_once(
    kubeconfig: Path, forbidding: HalfCluster, tmp_path: Path, signum: int
) -> None:
    with start(kubeconfig, tmp_path, "--health-port", "0") as operator:
        wait_for(lambda: forbidding.requests(JOBS), timeout=60, message="the cache's listing of jobs")
        assert operator.stop(signum) == 0, operator.text()[-3000:]
        assert "Traceback" not in operator.text()


@pytest.mark.parametrize("hang", ["/version", CRD, JOBS], ids=["reaching", "crd-check", "cache-sync"])
def test_a_sigterm_while_a_request_hangs_ends_the_operator_at_once(hang: str, tmp_path: Path) -> None:
    """Each stage of the start waits on the API server: none of them outlives a SIGTERM."""
    cluster = HalfCluster(hang=hang)
    with serve(cluster, tmp_path) as kubeconfig, start(kubeconfig, tmp_path, "--health-port", "0") as operator:
        wait_for(lambda: cluster.requests(hang), timeout=60, message=f"a request to {hang}")
        assert operator.stop(signal.SIGTERM) == 0, operator.text()[-3000:]
        assert "Traceback" not in operator.text()


def test_a_listing_the_server_never_answers_is_said_after_one_read_timeout_not_retried_unseen(
    tmp_path: Path,
) -> None:
    """The client's own retries would ask a hung server again three times, unlogged, before the
    cache could say anything: the user would wait minutes for the first line. The read timeout
    (30 s) is waited once; the cache's backoff asks again, and says so."""
    cluster = HalfCluster(hang=JOBS)
    with serve(cluster, tmp_path) as kubeconfig, start(kubeconfig, tmp_path, "--health-port", "0") as operator:
        first = wait_for(lambda: cluster.requests(JOBS)[:1], timeout=60, message="the cache's listing of jobs")[0]
        said = wait_for(
            lambda: [line for line in operator.text().splitlines() if "listing jobs.batch" in line],
            timeout=REQUEST_READ_SECONDS + STOP_SECONDS,
            message="the failed listing said",
        )
        assert "ReadTimeoutError" in said[0] or "timed out" in said[0], said
        asked_before = [t for t in cluster.requests(JOBS) if t < first + REQUEST_READ_SECONDS - 1]
        assert len(asked_before) == 1, f"the hung listing was asked again unseen: {asked_before}"
        assert operator.stop(signal.SIGTERM) == 0, operator.text()[-3000:]


def test_a_health_port_in_use_is_said_in_one_line(kubeconfig: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with start(kubeconfig, tmp_path, "--health-port", str(port), "--bind-address", "127.0.0.1") as operator:
            try:
                code = operator.process.wait(timeout=STOP_SECONDS)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"still running:\n{operator.text()[-3000:]}") from None
            said = f"error: --health-port {port}: cannot listen on 127.0.0.1 (Address already in use)"
            assert (code, operator.text().strip().splitlines()[-1]) == (1, said)
            assert "Traceback" not in operator.text()
