"""A real MLflow tracking server for tests: `mlflow server` (the full package, a dev
dependency) with a sqlite backend in a temporary folder, on a free loopback port, started as a
subprocess and waited for (its /health) with a timeout; stopped by process group at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.helpers import free_port, wait_for

START_SECONDS = 300


def tracking_client(uri: str) -> Any:
    """An MlflowClient of the server at `uri` (mlflow is imported here, on first use: importing
    it with the test modules cost every test process about 2 s of CPU at collection)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def _healthy(uri: str, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"mlflow server exited with {proc.returncode}")
    with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
        return bool(answer.status == 200)


@contextmanager
def mlflow_server(folder: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """The tracking URI of a running MLflow server whose state lives in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uri = f"http://{host}:{port}"
    mlflow = Path(sys.executable).with_name("mlflow")
    log = (folder / "server.log").open("wb")
    command = [
        str(mlflow), "server",
        "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
        "--default-artifact-root", (folder / "artifacts").as_uri(),
        "--host", host, "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # Without its job runner: a process (and its queue consumers) that imports MLflow again,
    # for server-side jobs no test uses.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder, env=env)
    try:
        wait_for(lambda: _healthy(uri, proc), timeout=START_SECONDS, interval=0.5, message="the MLflow server")
        yield uri
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()
