"""Rank 0's metrics port, with one control route beside /metrics: `POST /profile?id=ID&steps=N`
(answered with the profile's ProfileAnswer JSON). The attempt's NetworkPolicy admits the
operator and the monitoring pods to this port, so the route also asks for the attempt's profile
token (`Authorization: Bearer TOKEN`), which only the operator and the attempt's pods hold
(mpjob_contract.tracking.PROFILE_TOKEN_ENV), compared in constant time: without it, 401; a
trainer given no token answers no profile request at all (403). One capture at a time: a new id
asked while another is in flight is refused with 409 (asked again later). A request can only ask
for a bounded profile once per id, and nothing else about the trainer can be changed from here.
Everything else is prometheus_client's exposition, served by mpjob_contract.http_serving.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry, make_wsgi_app

from mpjob_contract import http_serving
from mpjob_contract.formats import whole_number
from mpjob_contract.tracking import PROFILE_PATH, ProfileAnswer
from mpjob_trainer.errors import ConfigError

#: Asks for profile (id, steps): its answer, or None while another capture is in flight.
Ask = Callable[[int, int], ProfileAnswer | None]
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _number(query: dict[str, list[str]], name: str) -> int | None:
    values = query.get(name) or [""]
    text = values[0]
    return whole_number(text, digits=9)


def _plain(start: Callable[..., Any], status: str, text: str, *headers: tuple[str, str]) -> list[bytes]:
    start(status, [("Content-Type", "text/plain"), *headers])
    return [text.encode() + b"\n"]


def authorized(environ: dict[str, Any], token: str) -> bool:
    """Whether the request carries `token` as its bearer token (compared in constant time)."""
    given = str(environ.get("HTTP_AUTHORIZATION", ""))[:512]
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def routes(registry: CollectorRegistry, ask: Ask | None, token: str | None = None) -> Wsgi:
    """/metrics (and any other GET) from the registry; POST /profile to `ask` when profiling,
    for a caller that holds `token` (none: no profile request is answered)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != PROFILE_PATH or ask is None:
            return metrics(environ, start)
        if environ.get("REQUEST_METHOD") != "POST":
            return _plain(start, "405 Method Not Allowed", "POST only", ("Allow", "POST"))
        if not token:
            return _plain(start, "403 Forbidden", "this attempt was given no profile token")
        if not authorized(environ, token):
            challenge = ("WWW-Authenticate", "Bearer")
            return _plain(start, "401 Unauthorized", "the attempt's profile token is needed", challenge)
        query = parse_qs(str(environ.get("QUERY_STRING", ""))[:256])
        profile_id, steps = _number(query, "id"), _number(query, "steps")
        if not profile_id or steps is None:
            return _plain(start, "400 Bad Request", "id and steps must be whole numbers")
        answer = ask(profile_id, steps)
        if answer is None:
            return _plain(start, "409 Conflict", "another profile is being captured: ask again later")
        body = answer.to_wire().encode()
        start("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


#: What the port variable may say for "serve no metrics".
NO_PORT = ("", "off", "none", "-1")


def port_setting(variable: str, raw: str) -> int | None:
    """The port `variable` (set to `raw`) asks for: None for none (NO_PORT), 0 for any free one."""
    if raw.strip().lower() in NO_PORT:
        return None
    port = whole_number(raw.strip(), digits=5)
    if port is None or not 0 <= port <= 65535:
        raise ConfigError(
            f"{variable}={raw!r}: not a port the trainer can serve metrics on: an integer port from 0 to 65535 "
            "(0: any free port), or off (also none, -1 or empty: serve no metrics)"
        )
    return port


def serve(port: int, host: str, app: Wsgi) -> int:
    """Serve `app` on host:port from a daemon thread (port 0: a free one); the port. Bounded
    (mpjob_contract.http_serving): a pod the policy admits cannot pile up idle connections."""
    httpd, _ = http_serving.serve(host, port, app)
    return int(httpd.server_port)
