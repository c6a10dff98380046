"""`mpjob run` whose bucket goes away mid-run: the S3 server is reached through a forwarder that
is cut after the first committed checkpoint (every later connection refused:
EndpointConnectionError, as with the server stopped). Training goes on, the run says once that it
has had no checkpoint for three save intervals, and nothing in the bucket is set aside as corrupt."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests import warm
from tests.helpers import NO_PLOT, wait_for
from tests.integration.storage.test_s3_local_run import client, env, manifest, report

pytestmark = pytest.mark.integration


class Forwarder:
    """A TCP forwarder to `target` on a port of its own; `cut` closes it and every connection."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open: list[socket.socket] = [self.listener]
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                inner, _ = self.listener.accept()
                outer = socket.create_connection(self.target)
                with self.lock:
                    self.open += [inner, outer]
                for a, b in ((inner, outer), (outer, inner)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        with self.lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.close()


@pytest.fixture
def forwarder(s3: dict[str, Any]) -> Iterator[Forwarder]:
    where = urlsplit(s3["endpoint"])
    assert where.hostname is not None and where.port is not None
    proxy = Forwarder((where.hostname, where.port))
    yield proxy
    proxy.cut()


def committed(s3: dict[str, Any]) -> list[str]:
    listed = client(s3).list_objects_v2(Bucket=s3["bucket"], Prefix=s3["prefix"] + "/")
    return [k for o in listed.get("Contents", []) if "/step-" in (k := o["Key"]) and k.endswith("/manifest.json")]


def test_a_bucket_gone_mid_run_is_said_once_and_nothing_is_set_aside(
    tmp_path: Path, s3: dict[str, Any], forwarder: Forwarder
) -> None:
    through = {**s3, "endpoint": f"http://127.0.0.1:{forwarder.port}"}
    spec = {"training": {"steps": 300, "batchSize": 4, "logEvery": 50}, "precision": {"mode": "fp32", "fallback": []}}
    job = manifest(tmp_path, through, name="outage", **spec, runPolicy={"maxAttempts": 1})
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "mpjob.cli", "run", str(job), "--out", str(out), "--plain", *NO_PLOT]
    with open(tmp_path / "stdout", "w") as sink:
        proc = warm.Popen(argv, env=env(), stdout=sink, stderr=sink, text=True)
        try:
            # Two committed: the first save has then ended whole (saves go one at a time), so the run
            # recorded it; a cut right after the first manifest could fail that save's last requests.
            first = wait_for(
                lambda: (found := committed(s3))[1:] and found, timeout=120, interval=0.05, message="two checkpoints"
            )
            forwarder.cut()
            proc.wait(timeout=300)
        finally:
            proc.kill()
    said = (tmp_path / "stdout").read_text()
    warnings = [line for line in said.splitlines() if "warning: no checkpoint for" in line]
    assert len(warnings) == 1, said
    assert "saves are failing or skipped" in warnings[0] and "(checkpoint step " in warnings[0], said
    status = report(out)
    failing = [c for c in status.get("conditions", []) if c["type"] == "CheckpointsFailing"]
    assert [(c["status"], c["reason"]) for c in failing] == [("True", "CheckpointsFailing")]
    keys = client(s3).list_objects_v2(Bucket=s3["bucket"], Prefix=s3["prefix"] + "/").get("Contents", [])
    assert not [o["Key"] for o in keys if "/.corrupt/" in o["Key"]]  # nothing set aside
    assert set(first) <= set(committed(s3))  # the checkpoints written before stay committed
