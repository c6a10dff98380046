"""The HTTP server behind both metrics endpoints (the operator's --metrics-port, a trainer's
rank-0 metrics port), bounded: pods the endpoint does not trust can connect to it.

Standard library only (wsgiref + socketserver, as prometheus_client's own server): each
connection gets a thread. Unbounded, a client holding idle connections costs a thread each, for
ever: thousands of them from any pod that reaches the port (the operator's Service is reachable
cluster-wide) fill the process's memory and pids. Here a connection that sends or reads nothing
for `idle_seconds` is closed, so is one whose request has not arrived whole `request_seconds`
after it connected (a client that sends a byte just inside the idle timeout would otherwise keep
its slot for ever, and `max_connections` of them would stop every scrape), and past
`max_connections` at once a new one is closed unanswered (the scraper retries at its next
interval) instead of getting a thread.
"""

from __future__ import annotations

import io
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: Connections served at once: Prometheus and the operator scrape with one or two each.
MAX_CONNECTIONS = 32
#: Seconds a connection may send or read nothing before it is closed (a scrape takes milliseconds).
IDLE_SECONDS = 10.0
#: Seconds a request (its line, headers and any body the app reads) has to arrive whole, however
#: it trickles in, from the moment its connection is taken.
REQUEST_SECONDS = 10.0


class BoundedServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `max_connections` of them."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS

    def server_activate(self) -> None:
        self.slots = threading.BoundedSemaphore(self.max_connections)
        super().server_activate()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # full: closed unanswered, no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went quiet or away (the timeout, a reset): nothing to print."""


class RequestReader(io.RawIOBase):
    """A connection's reads: each waits at most `idle` seconds, and none begins or waits past
    `seconds` from now (TimeoutError, as the socket's own timeout raises it)."""

    def __init__(self, sock: socket.socket, seconds: float, idle: float) -> None:
        super().__init__()
        self.sock, self.idle = sock, idle
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive whole in time")
        self.sock.settimeout(min(self.idle, left))
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(self.idle)  # the answer's writes: the idle timeout only


class QuietHandler(WSGIRequestHandler):
    """No access log (scrapes come every few seconds); closes a connection idle `timeout` seconds,
    or whose request has not arrived whole `request_seconds` after it was taken."""

    timeout = IDLE_SECONDS
    request_seconds = REQUEST_SECONDS

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own reader: its reads know no deadline
        self.rfile = io.BufferedReader(RequestReader(self.connection, self.request_seconds, self.timeout))

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: see the class."""


def serve(
    host: str,
    port: int,
    app: Wsgi,
    *,
    max_connections: int | None = None,
    idle_seconds: float | None = None,
    request_seconds: float | None = None,
    thread_name: str = "mpjob-metrics",
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `app` on host:port (port 0: a free one) from a daemon thread; the server and its
    thread. The limits default to MAX_CONNECTIONS, IDLE_SECONDS and REQUEST_SECONDS."""
    max_connections = MAX_CONNECTIONS if max_connections is None else max_connections
    idle_seconds = IDLE_SECONDS if idle_seconds is None else idle_seconds
    request_seconds = REQUEST_SECONDS if request_seconds is None else request_seconds
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    limits = {"address_family": family, "max_connections": max_connections}
    server_class = type("Server", (BoundedServer,), limits)
    handler = type("Handler", (QuietHandler,), {"timeout": idle_seconds, "request_seconds": request_seconds})
    httpd: WSGIServer = make_server(host, port, app, server_class, handler_class=handler)
    thread = threading.Thread(target=httpd.serve_forever, name=thread_name, daemon=True)
    thread.start()
    return httpd, thread
