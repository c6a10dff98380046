"""The test control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler on
127.0.0.1 with TLS, RBAC and ServiceAccount token signing, plus the node agent.

State lives in one directory (default `.cluster/`, or $MPJOB_CLUSTER_DIR): certificates,
etcd data, PID files, logs and the admin kubeconfig. Ports come from $MPJOB_CLUSTER_PORT_BASE
(default 16380): etcd client +0, etcd peer +1, apiserver +63, controller-manager +77,
scheduler +79. Every failure a user can fix is one line on stderr (ClusterError).
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")


class ClusterError(Exception):
    """A failure with a one-line explanation and a fix."""


@dataclass(frozen=True)
class Layout:
    root: Path
    port_base: int

    @classmethod
    def from_env(cls) -> Layout:
        root = Path(os.environ.get("MPJOB_CLUSTER_DIR") or REPO / ".cluster")
        return cls(root.resolve(), int(os.environ.get("MPJOB_CLUSTER_PORT_BASE", "16380")))

    @property
    def ports(self) -> dict[str, int]:
        b = self.port_base
        return {
            "etcd": b,
            "etcd-peer": b + 1,
            "kube-apiserver": b + 63,
            "kube-controller-manager": b + 77,
            "kube-scheduler": b + 79,
        }

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def pidfile(self, component: str) -> Path:
        return self.pids / f"{component}.pid"


# ------------------------------------------------------------------ binaries


def binaries() -> Path:
    """The directory holding etcd, kube-* binaries (and kubectl, helm): built and cached."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        path = Path(assets)
        missing = [b for b in ("etcd", "kube-apiserver") if not (path / b).exists()]
        if missing:
            raise ClusterError(f"KUBEBUILDER_ASSETS={assets} lacks {', '.join(missing)}; unset it to build them")
        return path
    build = REPO / "tests" / "cluster" / "build.sh"
    proc = subprocess.run(["bash", str(build)], capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise ClusterError(lines[-1] if lines else "tests/cluster/build.sh failed")
    return Path(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ certificates


def _openssl(*args: str) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"openssl {args[0]} failed: {proc.stderr.strip().splitlines()[-1:]}")


def _issue(pki: Path, name: str, subject: str, sans: list[str] | None = None, client: bool = False) -> None:
    key, csr, crt = pki / f"{name}.key", pki / f"{name}.csr", pki / f"{name}.crt"
    if crt.exists():
        return
    _openssl("genrsa", "-out", str(key), "2048")
    _openssl("req", "-new", "-key", str(key), "-out", str(csr), "-subj", subject)
    ext = pki / f"{name}.ext"
    usage = "clientAuth" if client else "serverAuth,clientAuth"
    lines = ["basicConstraints=CA:FALSE", "keyUsage=digitalSignature,keyEncipherment", f"extendedKeyUsage={usage}"]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(pki / "ca.crt"),
        "-CAkey",
        str(pki / "ca.key"),
        "-CAcreateserial",
        "-out",
        str(crt),
        "-days",
        "3650",
        "-sha256",
        "-extfile",
        str(ext),
    )


def ensure_pki(layout: Layout) -> None:
    pki = layout.pki
    pki.mkdir(parents=True, exist_ok=True)
    if not (pki / "ca.crt").exists():
        _openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(pki / "ca.key"),
            "-out",
            str(pki / "ca.crt"),
            "-days",
            "3650",
            "-subj",
            "/CN=mpjob-test-ca",
        )
    _issue(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        [
            "IP:127.0.0.1",
            "IP:10.0.0.1",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ],
    )
    _issue(pki, "admin", "/O=system:masters/CN=mpjob-admin", client=True)
    _issue(pki, "controller-manager", "/CN=system:kube-controller-manager", client=True)
    _issue(pki, "scheduler", "/CN=system:kube-scheduler", client=True)
    if not (pki / "sa.key").exists():
        _openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        _openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))


def write_kubeconfig(layout: Layout, path: Path, user: str) -> None:
    pki = layout.pki
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: mpjob-test
  cluster: {{server: "{layout.server}", certificate-authority: "{pki / "ca.crt"}"}}
users:
- name: {user}
  user: {{client-certificate: "{pki / (user + ".crt")}", client-key: "{pki / (user + ".key")}"}}
contexts:
- name: mpjob-test
  context: {{cluster: mpjob-test, user: {user}, namespace: default}}
current-context: mpjob-test
"""
    )


# ------------------------------------------------------------------ processes


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def read_pid(layout: Layout, component: str) -> int | None:
    try:
        return int(layout.pidfile(component).read_text().strip())
    except (OSError, ValueError):
        return None


def running(layout: Layout) -> dict[str, int]:
    out = {}
    for component in COMPONENTS:
        pid = read_pid(layout, component)
        if pid and pid_alive(pid):
            out[component] = pid
    return out


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _start(layout: Layout, component: str, argv: list[str], env: dict[str, str] | None = None) -> int:
    layout.logs.mkdir(parents=True, exist_ok=True)
    layout.pids.mkdir(parents=True, exist_ok=True)
    log = (layout.logs / f"{component}.log").open("ab")
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
    try:
        with urllib.request.urlopen(layout.server + "/readyz", context=_ssl_context(layout), timeout=timeout) as r:
            return bool(r.status == 200)
    except (OSError, ssl.SSLError):
        return False


def _wait(layout: Layout, what: str, check: object, timeout: float, component: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        pid = read_pid(layout, component)
        if pid is None or not pid_alive(pid):
            tail = (layout.logs / f"{component}.log").read_text(errors="replace").strip().splitlines()[-3:]
            raise ClusterError(f"{component} exited while starting: {' | '.join(tail)} (log: {layout.logs})")
        time.sleep(0.2)
    raise ClusterError(f"{what} not ready after {timeout:.0f}s (logs: {layout.logs})")


def up(layout: Layout) -> float:
    """Start (or reuse) the cluster; returns the seconds it took to become ready."""
    started = time.monotonic()
    alive = running(layout)
    if set(alive) == set(COMPONENTS) and (layout.pki / "ca.crt").exists() and api_ready(layout):
        return 0.0
    if alive:
        down(layout)
    for component, port in layout.ports.items():
        if not _port_free(port):
            raise ClusterError(
                f"port {port} ({component}) on 127.0.0.1 is in use by another process; stop it or set "
                f"MPJOB_CLUSTER_PORT_BASE to another base port (now {layout.port_base})"
            )
    bins = binaries()
    if subprocess.run(["openssl", "version"], capture_output=True).returncode != 0:
        raise ClusterError("openssl is missing; install it (apt-get install openssl)")
    ensure_pki(layout)
    write_kubeconfig(layout, layout.kubeconfig, "admin")
    write_kubeconfig(layout, layout.root / "controller-manager.kubeconfig", "controller-manager")
    write_kubeconfig(layout, layout.root / "scheduler.kubeconfig", "scheduler")
    p, pki, root = layout.ports, layout.pki, layout.root

    _start(
        layout,
        "etcd",
        [
            str(bins / "etcd"),
            "--name",
            "default",
            "--data-dir",
            str(root / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{p['etcd']}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{p['etcd']}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{p['etcd-peer']}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{p['etcd-peer']}",
            "--initial-cluster",
            f"default=http://127.0.0.1:{p['etcd-peer']}",
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ],
    )
    _start(
        layout,
        "kube-apiserver",
        [
            str(bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={p['kube-apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--api-audiences=https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={root / 'apiserver-certs'}",
            "--enable-priority-and-fairness=false",
            "--endpoint-reconciler-type=none",
            "--v=0",
        ],
    )
    _wait(layout, "kube-apiserver", lambda: api_ready(layout), 60, "kube-apiserver")
    cm = root / "controller-manager.kubeconfig"
    _start(
        layout,
        "kube-controller-manager",
        [
            str(bins / "kube-controller-manager"),
            f"--kubeconfig={cm}",
            f"--authentication-kubeconfig={cm}",
            f"--authorization-kubeconfig={cm}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-controller-manager']}",
            "--controllers=*,-nodeipam,-service,-route,-cloud-node-lifecycle,-persistentvolume-expander",
            "--concurrent-job-syncs=10",
            # The Job controller's client would otherwise hold every Job's status writes to 20/s:
            # with a hundred attempts ending at once that alone is seconds of queueing.
            "--kube-api-qps=200",
            "--kube-api-burst=400",
            "--v=0",
        ],
    )
    sc = root / "scheduler.kubeconfig"
    _start(
        layout,
        "kube-scheduler",
        [
            str(bins / "kube-scheduler"),
            f"--kubeconfig={sc}",
            f"--authentication-kubeconfig={sc}",
            f"--authorization-kubeconfig={sc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p['kube-scheduler']}",
            "--v=0",
        ],
    )
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{bins}{os.pathsep}{env.get('PATH', '')}"
    _start(
        layout,
        "node-agent",
        [
            sys.executable,
            "-m",
            "tests.cluster.nodeagent",
            "--kubeconfig",
            str(layout.kubeconfig),
            "--state-dir",
            str(root),
        ],
        env={**env, "PYTHONPATH": str(REPO)},
    )
    from tests.cluster.readiness import wait_ready

    wait_ready(layout, timeout=60)
    return time.monotonic() - started


def down(layout: Layout, timeout: float = 15.0) -> list[int]:
    """Stop every process the cluster started (agent first, so it stops its pods); returns the PIDs."""
    stopped: list[int] = []
    for component in reversed(COMPONENTS):
        pid = read_pid(layout, component)
        if pid is None:
            continue
        if pid_alive(pid):
            with _suppress():
                os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid_alive(pid):
                with _suppress():
                    os.killpg(pid, signal.SIGKILL)
            stopped.append(pid)
        layout.pidfile(component).unlink(missing_ok=True)
    from tests.cluster.nodeagent import kill_recorded_pods

    stopped += kill_recorded_pods(layout.root)
    return stopped


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ProcessLookupError, PermissionError))  # type: ignore[arg-type]
