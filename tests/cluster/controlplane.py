"""The test control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler on
127.0.0.1 with TLS, RBAC and ServiceAccount token signing, plus the node agent, and Kueue
when asked for (`up(layout, kueue=True)` or `start_kueue`; see `kueue`).

Each control-plane process (and Kueue) runs under `supervise`, which starts it again when it
dies, as a kubelet restarts a static pod: a `kill -9` of etcd or the apiserver mid-run is a
restart the operator must ride through, not the end of the cluster.

`up` starts them (or reuses a running, ready set), `down` stops them. Where the state lives
and which ports are used is `layout.Layout`; what each process runs is `components`. Every
failure a user can fix is one line on stderr (ClusterError).

This is the package's front: it imports the parts below it (layout, binaries, pki,
components, readiness, the node agent's state) and re-exports what tests and benchmarks use.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

from tests.cluster import components, kueue, s3
from tests.cluster.binaries import binaries
from tests.cluster.layout import (
    ALL_COMPONENTS,
    COMPONENTS,
    OPTIONAL_COMPONENTS,
    REPO,
    WARM_SERVERS,
    ClusterError,
    Layout,
    pid_alive,
    read_pid,
    running,
)
from tests.cluster.nodeagent.state import kill_recorded_pods
from tests.cluster.pki import check_openssl, write_credentials
from tests.cluster.readiness import wait_ready
from tests.warm import rules

__all__ = [
    "COMPONENTS",
    "ClusterError",
    "Layout",
    "api_ready",
    "binaries",
    "down",
    "exclusive",
    "pid_alive",
    "read_pid",
    "running",
    "start_kueue",
    "up",
]

START_TIMEOUT = 60
KUEUE_START_TIMEOUT = 120
SUPERVISED = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kueue", "s3")
#: The supervised components are Go programs: a collection when the heap has grown by 4x, not
#: 2x (memory is plentiful here, cores are not; GOGC from the environment wins).
GO_ENV = {"GOGC": "400"}


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_ports(layout: Layout, keep: set[str]) -> None:
    """Every port of the cluster is free, but those of the running components in `keep`."""
    for component, port in layout.ports.items():
        if component.split("-")[0] in keep:  # kueue-webhook belongs to kueue, s3 to s3
            continue
        if not _port_free(port):
            raise ClusterError(
                f"port {port} ({component}) on 127.0.0.1 is in use by another process; stop it or set "
                f"MPJOB_CLUSTER_PORT_BASE to another base port (now {layout.port_base})"
            )


def _start(layout: Layout, component: str, argv: list[str], *, env: dict[str, str] | None = None) -> int:
    """Start one component in its own session, logging to logs/<component>.log; its PID
    (the supervisor's, for a supervised component)."""
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    if component in SUPERVISED:
        child = str(layout.child_pidfile(component))
        argv = [sys.executable, "-m", "tests.cluster.supervise", child, "--", *argv]
        env = {**GO_ENV, **(env or os.environ), "PYTHONPATH": str(REPO)}
    with (layout.logs / f"{component}.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env
        )
    layout.pidfile(component).write_text(str(proc.pid))
    return proc.pid


def _ssl_context(layout: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(layout.pki / "ca.crt"))
    ctx.load_cert_chain(str(layout.pki / "admin.crt"), str(layout.pki / "admin.key"))
    return ctx


def api_ready(layout: Layout, timeout: float = 1.0) -> bool:
    """Whether the apiserver answers /readyz with 200."""
    try:
        with urllib.request.urlopen(layout.server + "/readyz", context=_ssl_context(layout), timeout=timeout) as r:
            return bool(r.status == 200)
    except (OSError, ssl.SSLError):
        return False


def _wait(layout: Layout, component: str, check: Callable[[], bool], *, timeout: float) -> None:
    """Wait for `check`; fail at once with the log's tail if the component exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        pid = read_pid(layout, component)
        if pid is None or not pid_alive(pid):
            tail = (layout.logs / f"{component}.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise ClusterError(f"{component} exited while starting: {' | '.join(tail)} (log: {layout.logs})")
        time.sleep(0.2)
    raise ClusterError(f"{component} not ready after {timeout:.0f}s (logs: {layout.logs})")


@contextlib.contextmanager
def exclusive(layout: Layout) -> Iterator[None]:
    """Held by a test process while it starts the cluster or adds a component to it: parallel
    test workers share one cluster, and only one of them may start each of its processes."""
    layout.root.mkdir(parents=True, exist_ok=True)
    with open(layout.root / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def up(layout: Layout, *, with_kueue: bool = False) -> float:
    """Start (or reuse) the cluster, with Kueue if asked; returns the seconds it took to become
    ready (0 when everything asked for was running already)."""
    started = time.monotonic()
    alive = running(layout)
    if set(COMPONENTS) <= set(alive) and (layout.pki / "ca.crt").exists() and api_ready(layout):
        start_warm(layout)
        if "s3" not in alive:
            start_s3(layout)
        if not with_kueue or "kueue" in alive:
            return 0.0 if "s3" in alive else time.monotonic() - started
        start_kueue(layout)
        return time.monotonic() - started
    if set(alive) - set(OPTIONAL_COMPONENTS + WARM_SERVERS):  # a partial control plane: start it anew
        down(layout)
        alive = {}
    # The S3 server alone may be up (store tests need no control plane) and in use: keep it.
    _check_ports(layout, keep=set(alive))
    bins = binaries()
    check_openssl()
    write_credentials(layout)
    _start(layout, "etcd", components.etcd(layout, bins))
    _start(layout, "kube-apiserver", components.kube_apiserver(layout, bins))
    _wait(layout, "kube-apiserver", lambda: api_ready(layout), timeout=START_TIMEOUT)
    _start(layout, "kube-controller-manager", components.kube_controller_manager(layout, bins))
    _start(layout, "kube-scheduler", components.kube_scheduler(layout, bins))
    start_warm(layout)
    _start(layout, "node-agent", components.node_agent(layout), env=components.node_agent_env(layout, bins))
    wait_ready(layout, timeout=START_TIMEOUT)
    start_s3(layout)
    if with_kueue:
        start_kueue(layout)
    return time.monotonic() - started


def start_warm(layout: Layout) -> None:
    """Start the warm-start servers that are not running (none with MPJOB_TEST_COLD=1); the
    pods' ranks start cold until a server is ready, and from then on are forked by it."""
    if rules.cold():
        return
    layout.warm.mkdir(parents=True, exist_ok=True)
    alive = running(layout)
    for component in WARM_SERVERS:
        if component not in alive:
            argv = components.warm_server(layout, component.removeprefix("warm-"))
            _start(layout, component, argv, env=components.pods_env())


def start_s3(layout: Layout) -> s3.S3Server:
    """Add the S3 server to the running cluster (idempotent); where it answers."""
    if "s3" not in running(layout):
        _start(layout, "s3", s3.argv(layout, s3.build()))
    return s3.wait_ready(layout)


def start_kueue(layout: Layout) -> None:
    """Add Kueue to the running cluster (idempotent): its CRDs, its process, then its webhooks,
    registered only once it serves them (a registered webhook nobody serves fails requests)."""
    if "kueue" in running(layout):
        return
    bins = binaries()
    kueue_bin, src = kueue.build()
    kueue.install_crds(bins, layout, src)
    _start(layout, "kueue", kueue.argv(layout, kueue_bin))
    _wait(layout, "kueue", lambda: kueue.ready(layout), timeout=KUEUE_START_TIMEOUT)
    kueue.kubectl_apply(bins, layout, kueue.webhook_configurations(layout, src))


def _stop(pid: int, timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it if it outlives `timeout`."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if pid_alive(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


def down(layout: Layout, timeout: float = 15.0) -> list[int]:
    """Stop every process the cluster started (agent first, so it stops its pods); returns the PIDs."""
    stopped: list[int] = []
    for component in reversed(ALL_COMPONENTS):
        pid = read_pid(layout, component)
        if pid is None:
            continue
        if pid_alive(pid):
            _stop(pid, timeout)
            stopped.append(pid)
        layout.pidfile(component).unlink(missing_ok=True)
        layout.child_pidfile(component).unlink(missing_ok=True)
    stopped += kill_recorded_pods(layout.root)
    return stopped
