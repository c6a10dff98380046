"""The server's answers, one JSON line each, as the client and the stand-in read them."""

from __future__ import annotations

import json
import select
import socket
from typing import Any


class Replies:
    """The answer lines on one connection to a warm-start server."""

    def __init__(self, conn: socket.socket) -> None:
        self.conn, self.buffer = conn, b""

    def next(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next line; None when none came within `timeout` seconds (None: wait for it).
        A signal's handler runs meanwhile and the wait goes on (PEP 475)."""
        while b"\n" not in self.buffer:
            if not select.select([self.conn], [], [], timeout)[0]:
                return None
            chunk = self.conn.recv(4096)
            if not chunk:
                raise ConnectionError("the warm-start server went away")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        reply: dict[str, Any] = json.loads(line)
        return reply
