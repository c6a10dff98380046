"""A bounded read of a trainer's Prometheus endpoint: the operator connects to a tenant's pod,
so nothing the endpoint does may cost it more than one deadline and one byte cap.

One plain HTTP/1.0 GET over a socket, no library in between: one overall deadline (each
receive waits at most what is left of it, so a slow drip ends on time), a cap on the bytes
read (a huge body is cut off, never held), no redirects (a 3xx is a failure, never followed:
the operator fetches nothing but the pod's own endpoint), only 200 with an identity body, and
text that must be UTF-8.
"""

from __future__ import annotations

import socket
import time

from mpjob_contract.formats import whole_number

#: Bytes of headers read before the body; the trainer sends a few hundred.
HEAD_LIMIT = 16 * 1024
RECEIVE = 64 * 1024


class ScrapeError(Exception):
    """The endpoint could not be read within the bounds (the message says which); `status`: the
    HTTP status it answered instead of 200, when it answered one."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def fetch(
    host: str,
    port: int,
    *,
    path: str = "/metrics",
    deadline: float,
    max_bytes: int,
    method: str = "GET",
    bearer: str | None = None,
) -> str:
    """The body of `GET http://host:port/path` (or a body-less POST, with `bearer` as its
    Authorization) as text, read within `deadline` seconds and `max_bytes` bytes of body;
    raises ScrapeError otherwise."""
    end = time.monotonic() + deadline
    length = "Content-Length: 0\r\n" if method == "POST" else ""
    auth = f"Authorization: Bearer {bearer}\r\n" if bearer is not None else ""
    request = (
        f"{method} {path} HTTP/1.0\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n{length}{auth}"
        "Accept-Encoding: identity\r\n\r\n"
    )
    try:
        with socket.create_connection((host, port), timeout=max(deadline, 0.001)) as sock:
            sock.settimeout(_left(end))
            sock.sendall(request.encode("ascii"))
            data = _receive(sock, end=end, limit=HEAD_LIMIT + max_bytes)
    except ScrapeError:
        raise
    except (OSError, ValueError) as exc:  # refused, reset, timed out (TimeoutError is an OSError)
        raise ScrapeError(f"{type(exc).__name__}: {exc}") from exc
    return _body(data, max_bytes=max_bytes)


def _left(end: float) -> float:
    left = end - time.monotonic()
    if left <= 0:
        raise ScrapeError("deadline passed")
    return left


def _receive(sock: socket.socket, *, end: float, limit: int) -> bytes:
    """Everything the server sends until it closes, within the deadline and `limit` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        sock.settimeout(_left(end))
        chunk = sock.recv(RECEIVE)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise ScrapeError(f"response larger than {limit} bytes")
        chunks.append(chunk)


def _body(data: bytes, *, max_bytes: int) -> str:
    """The body of a complete HTTP response, when it is a 200 with an identity body."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or len(head) > HEAD_LIMIT:
        raise ScrapeError("no complete HTTP header")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or parts[1] != "200":
        status = whole_number(parts[1], digits=3) if len(parts) >= 2 and parts[0].startswith("HTTP/") else None
        said = f"status line {lines[0][:80]!r} (only 200 is read; redirects are never followed)"
        raise ScrapeError(said, status=status)
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("transfer-encoding", "identity").lower() != "identity" or headers.get("content-encoding"):
        raise ScrapeError("an encoded body (only identity is read)")
    length = headers.get("content-length")
    if length is not None and whole_number(length, digits=19) != len(body):  # only ScrapeError: ASCII digits
        raise ScrapeError(f"body of {len(body)} bytes, Content-Length {length[:20]}")
    if len(body) > max_bytes:
        raise ScrapeError(f"body larger than {max_bytes} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError("body is not UTF-8") from exc
