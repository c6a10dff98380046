"""Rank 0's metrics port, with one control route beside /metrics: `POST /profile?id=ID&steps=N`
(answered with the profile's ProfileAnswer JSON). The operator, which already reads this port
with bounded requests, is the one caller the attempt's NetworkPolicy admits besides the
monitoring pods; a request can only ask for a bounded profile once per id, and nothing else
about the trainer can be changed from here. Everything else is prometheus_client's exposition.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from mpjob_contract.tracking import PROFILE_PATH, ProfileAnswer

Ask = Callable[[int, int], ProfileAnswer]
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds: no access log on the trainer's stderr."""


def _number(query: dict[str, list[str]], name: str) -> int | None:
    values = query.get(name) or [""]
    text = values[0]
    return int(text) if text.isdigit() and len(text) <= 9 else None


def routes(registry: CollectorRegistry, ask: Ask | None) -> Wsgi:
    """/metrics (and any other GET) from the registry; POST /profile to `ask` when profiling."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PROFILE_PATH or ask is None:
            return metrics(environ, start)
        if environ.get("REQUEST_METHOD") != "POST":
            start("405 Method Not Allowed", [("Allow", "POST"), ("Content-Type", "text/plain")])
            return [b"POST only\n"]
        query = parse_qs(str(environ.get("QUERY_STRING", ""))[:256])
        profile_id, steps = _number(query, "id"), _number(query, "steps")
        if not profile_id or steps is None:
            start("400 Bad Request", [("Content-Type", "text/plain")])
            return [b"id and steps must be whole numbers\n"]
        body = ask(profile_id, steps).to_wire().encode()
        start("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve(port: int, host: str, app: Wsgi) -> int:
    """Serve `app` on host:port from a daemon thread (port 0: a free one); the port."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("Server", (_Server,), {"address_family": family})
    httpd: WSGIServer = make_server(host, port, app, server_class, handler_class=_Quiet)
    threading.Thread(target=httpd.serve_forever, name="mpjob-metrics", daemon=True).start()
    return int(httpd.server_port)
