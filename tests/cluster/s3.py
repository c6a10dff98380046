"""An S3 server in the test cluster: versitygw (Apache-2.0, an S3 gateway over a POSIX folder),
built from the Go module pinned in `s3-build/go.mod` by `build-s3.sh` (cached by version), run
as a local process beside the control plane on 127.0.0.1 (port base +87, `Layout.ports`), its objects under
`<cluster dir>/s3/`. Pods of this cluster are local processes, so they reach it at the same
address. `make cluster` starts it; `start` adds it to a cluster already up (the `s3` fixture).

The e2e suite's bucket (`mpjob-e2e`) and the root credentials below exist in every cluster; a
test makes its own Secret from `CREDENTIALS` in its namespace. versitygw is chosen over MinIO
(AGPL, and a far larger build) and over moto (a mock, not a server with S3's semantics).
"""

from __future__ import annotations

import re
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.layout import REPO, ClusterError, Layout

BUILD_SCRIPT = REPO / "tests" / "cluster" / "build-s3.sh"
GO_MOD = REPO / "tests" / "cluster" / "s3-build" / "go.mod"
BUCKET = "mpjob-e2e"
#: The server's root user: test-only credentials of a server that listens on loopback only.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "mpjob-e2e-access", "AWS_SECRET_ACCESS_KEY": "mpjob-e2e-secret-key"}
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str = BUCKET
    region: str = "us-east-1"


def pinned_version() -> str:
    match = re.search(r"github\.com/versity/versitygw (v\S+)", GO_MOD.read_text())
    if not match:
        raise ClusterError(f"no github.com/versity/versitygw version pinned in {GO_MOD}")
    return match.group(1)


def build() -> Path:
    """The bin directory holding `versitygw`: built and cached."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ClusterError(lines[-1] if lines else f"{BUILD_SCRIPT} failed")
    return Path(proc.stdout.strip().splitlines()[-1])


def endpoint(layout: Layout) -> str:
    return f"http://127.0.0.1:{layout.ports['s3']}"


def data_dir(layout: Layout) -> Path:
    return layout.root / "s3"


def argv(layout: Layout, bin_dir: Path) -> list[str]:
    """versitygw on loopback with the root credentials, objects under data_dir (the e2e
    bucket is a folder there: the posix backend's buckets are its top-level folders)."""
    (data_dir(layout) / BUCKET).mkdir(parents=True, exist_ok=True)
    return [
        str(bin_dir / "versitygw"),
        "--port",
        f"127.0.0.1:{layout.ports['s3']}",
        "--access",
        CREDENTIALS["AWS_ACCESS_KEY_ID"],
        "--secret",
        CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        "--quiet",
        "posix",
        str(data_dir(layout)),
    ]


def ready(layout: Layout) -> bool:
    """The server answers HTTP (an unsigned request is refused: that is an answer)."""
    try:
        with urllib.request.urlopen(endpoint(layout), timeout=1):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def wait_ready(layout: Layout, timeout: float = START_TIMEOUT) -> S3Server:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready(layout):
            return S3Server(endpoint(layout))
        time.sleep(0.2)
    raise ClusterError(f"versitygw not answering on {endpoint(layout)} after {timeout:.0f}s (logs: {layout.logs})")
