"""Both metrics endpoints (the operator's, reachable through its Service from any pod, and a
trainer's rank 0, which the attempt's NetworkPolicy opens to the operator and monitoring) are
read by pods they do not trust: idle connections cost them a thread each only up to a bound,
and only for a while, and a scrape is still answered once the idle ones are closed."""

from __future__ import annotations

import select
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

IDLE, MOST, REQUEST = 0.5, 4, 1.5


def _trainer(monkeypatch: pytest.MonkeyPatch) -> int:
    return control.serve(0, "127.0.0.1", control.routes(CollectorRegistry(), None))


def _operator(monkeypatch: pytest.MonkeyPatch) -> int:
    server = MetricsServer.start(0, "127.0.0.1")
    return int(server.server.server_port)


@pytest.fixture(params=[_trainer, _operator], ids=["trainer", "operator"])
def port(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setattr(http_serving, "MAX_CONNECTIONS", MOST)
    monkeypatch.setattr(http_serving, "IDLE_SECONDS", IDLE)
    monkeypatch.setattr(http_serving, "REQUEST_SECONDS", REQUEST)
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


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (what it sends then reads as the end, or a reset)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(64) == b""
    except OSError:
        return True


def _trickle(sock: socket.socket) -> bool:
    """One more byte of a header that never ends; False when the server has closed `sock`."""
    try:
        sock.sendall(b"a")
    except OSError:
        return False
    return True


def test_a_request_trickled_in_slower_than_its_deadline_loses_its_slot(port: int) -> None:
    """One byte a connection, each well inside the idle timeout: the request never arrives whole,
    so its connection is closed by the deadline for the whole request, and once every slot's
    trickle is closed a scrape is answered again."""
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(MOST)]
    for sock in held:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
    began, closed_at = time.monotonic(), dict[int, float]()
    try:
        while len(closed_at) < len(held) and time.monotonic() - began < REQUEST + 6:
            for i, sock in enumerate(held):
                if i not in closed_at and (_closed(sock) or not _trickle(sock)):
                    closed_at[i] = time.monotonic() - began
            time.sleep(IDLE / 4)
        assert len(closed_at) == len(held), f"open after {REQUEST + 6}s: {len(held) - len(closed_at)}"
        assert min(closed_at.values()) > REQUEST - 0.3 and max(closed_at.values()) < REQUEST + IDLE + 1.0
        assert _scrape(port).startswith(b"HTTP/1.0 200")
    finally:
        for sock in held:
            sock.close()
