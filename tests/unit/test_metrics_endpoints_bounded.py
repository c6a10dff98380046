"""Both metrics endpoints (the operator's, reachable through its Service from any pod, and a
trainer's rank 0, which the attempt's NetworkPolicy opens to the operator and monitoring) are
read by pods they do not trust: idle connections cost them a thread each only up to a bound,
and only for a while, and a scrape is still answered once the idle ones are closed."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client import CollectorRegistry

from mpjob.controller.metrics_server import MetricsServer
from mpjob_contract import http_serving
from mpjob_trainer import control

pytestmark = pytest.mark.unit

IDLE, MOST = 0.5, 4


def _trainer(monkeypatch: pytest.MonkeyPatch) -> int:
    return control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), None))


def _operator(monkeypatch: pytest.MonkeyPatch) -> int:
    server = MetricsServer.start(0, "127.0.0.1")
    return int(server.server.server_port)


@pytest.fixture(params=[_trainer, _operator], ids=["trainer", "operator"])
def port(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(http_serving, "MAX_CONNECTIONS", MOST)
    monkeypatch.setattr(http_serving, "IDLE_SECONDS", IDLE)
    start: Callable[[pytest.MonkeyPatch], int] = request.param
    yield start(monkeypatch)


def _scrape(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        return sock.recv(16)


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_idle_connections_are_bounded_then_closed_and_scrapes_go_on(port: int) -> None:
    before = threading.active_count()
    held = []
    for _ in range(MOST * 3):  # a request begun and never finished
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        held.append(sock)
    try:
        # The server took at most MOST of them (each a thread); the rest were closed unanswered.
        assert _wait(lambda: threading.active_count() - before <= MOST, 10)
        # Every one is closed by the server: unanswered past the bound, or once it has said
        # nothing for IDLE seconds; then their threads are gone and a scrape is answered.
        for sock in held:
            sock.settimeout(10)
            assert sock.recv(1) == b""
        assert _wait(lambda: threading.active_count() <= before, 10)
        assert _scrape(port).startswith(b"HTTP/1.0 200")
    finally:
        for sock in held:
            sock.close()
