"""The HTTP server behind both metrics endpoints (the operator's --metrics-port, a trainer's
rank-0 metrics port), bounded: pods the endpoint does not trust can connect to it.

Standard library only (wsgiref + socketserver, as prometheus_client's own server): each
connection gets a thread. Unbounded, a client holding idle connections costs a thread each, for
ever: thousands of them from any pod that reaches the port (the operator's Service is reachable
cluster-wide) fill the process's memory and pids. Here a connection that sends or reads nothing
for `idle_seconds` is closed, and past `max_connections` at once a new one is closed unanswered
(the scraper retries at its next interval) instead of getting a thread.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: Connections served at once: Prometheus and the operator scrape with one or two each.
MAX_CONNECTIONS = 32
#: Seconds a connection may send or read nothing before it is closed (a scrape takes milliseconds).
IDLE_SECONDS = 10.0


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


class QuietHandler(WSGIRequestHandler):
    """No access log (scrapes come every few seconds); closes a connection idle `timeout` seconds."""

    timeout = IDLE_SECONDS

    def log_message(self, format: str, *args: Any) -> None:
        """Nothing: see the class."""


def serve(
    host: str,
    port: int,
    app: Wsgi,
    *,
    max_connections: int | None = None,
    idle_seconds: float | None = None,
    thread_name: str = "mpjob-metrics",
) -> tuple[WSGIServer, threading.Thread]:
    """Serve `app` on host:port (port 0: a free one) from a daemon thread; the server and its
    thread. The limits default to MAX_CONNECTIONS and IDLE_SECONDS."""
    max_connections = MAX_CONNECTIONS if max_connections is None else max_connections
    idle_seconds = IDLE_SECONDS if idle_seconds is None else idle_seconds
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    limits = {"address_family": family, "max_connections": max_connections}
    server_class = type("Server", (BoundedServer,), limits)
    handler = type("Handler", (QuietHandler,), {"timeout": idle_seconds})
    httpd: WSGIServer = make_server(host, port, app, server_class, handler_class=handler)
    thread = threading.Thread(target=httpd.serve_forever, name=thread_name, daemon=True)
    thread.start()
    return httpd, thread
