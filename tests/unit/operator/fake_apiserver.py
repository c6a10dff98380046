"""A fake API server for the operator's start-up tests: it answers /version as a v1.34 API
server does, hangs on the paths a test names, and refuses the rest with 403, recording every
request; `serve` runs it and writes a kubeconfig of it."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

NAMESPACE = "team-a"

#: /version as a v1.34 API server answers it (the client reads every field).
VERSION = {
    **{"major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "0", "gitTreeState": "clean"},
    **{"buildDate": "2025-08-27T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64"},
}
FORBIDDEN = (
    'jobs.batch is forbidden: User "system:serviceaccount:mpjob-system:mpjob" cannot list resource "jobs" '
    f'in API group "batch" in the namespace "{NAMESPACE}"'
)


@dataclass
class HalfCluster:
    """What the fake API server does: answer /version, hang on paths starting with `hang`, and
    refuse the rest with 403; every request seen, as (monotonic time, path)."""

    hang: str | None = None
    seen: list[tuple[float, str]] = field(default_factory=list)
    released: threading.Event = field(default_factory=threading.Event)

    def requests(self, prefix: str) -> list[float]:
        return [t for t, path in list(self.seen) if path.startswith(prefix)]


def handler_for(cluster: HalfCluster) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            cluster.seen.append((time.monotonic(), self.path))
            if cluster.hang is not None and self.path.startswith(cluster.hang):
                cluster.released.wait(120)
                return
            if self.path.rstrip("/") == "/version":
                self._answer(200, VERSION)
            else:
                status = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
                self._answer(403, {**status, "message": FORBIDDEN})

        def _answer(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def serve(cluster: HalfCluster, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig of the fake API server, which runs until the test ends."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_for(cluster))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n"
    )
    try:
        yield path
    finally:
        cluster.released.set()
        server.shutdown()
        server.server_close()
