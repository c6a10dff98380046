"""What each process of the test cluster is started with: pure functions of the layout
and the binaries directory, one per component, in the order `up` starts them.

The apiserver has TLS, RBAC and ServiceAccount token signing on, like a real cluster, so
the operator's RBAC and the pods' credentials are tested for real. The node agent is this
repository's Python (`tests.cluster.nodeagent`), run by the same interpreter.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.cluster.layout import REPO, Layout
from tests.cluster.pki import kubeconfig_path
from tests.warm import client as warm

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def _flags(pairs: dict[str, str]) -> list[str]:
    return [item for flag, value in pairs.items() for item in (flag, value)]


def etcd(layout: Layout, bins: Path) -> list[str]:
    p = layout.ports
    peer = f"http://127.0.0.1:{p['etcd-peer']}"
    flags = {
        "--name": "default",
        "--data-dir": str(layout.root / "etcd"),
        "--listen-client-urls": f"http://127.0.0.1:{p['etcd']}",
        "--advertise-client-urls": f"http://127.0.0.1:{p['etcd']}",
        "--listen-peer-urls": peer,
        "--initial-advertise-peer-urls": peer,
        "--initial-cluster": f"default={peer}",
    }
    return [str(bins / "etcd"), *_flags(flags), "--unsafe-no-fsync", "--log-level", "warn"]


def kube_apiserver(layout: Layout, bins: Path) -> list[str]:
    pki = layout.pki
    return [
        str(bins / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{layout.ports['etcd']}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={layout.ports['kube-apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--api-audiences={SERVICE_ACCOUNT_ISSUER}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--allow-privileged=true",
        "--profiling=false",
        f"--cert-dir={layout.root / 'apiserver-certs'}",
        "--enable-priority-and-fairness=false",
        "--endpoint-reconciler-type=none",
        "--v=0",
    ]


def _kubeconfig_flags(layout: Layout, user: str) -> list[str]:
    path = kubeconfig_path(layout, user)
    return [f"--kubeconfig={path}", f"--authentication-kubeconfig={path}", f"--authorization-kubeconfig={path}"]


def kube_controller_manager(layout: Layout, bins: Path) -> list[str]:
    return [
        str(bins / "kube-controller-manager"),
        *_kubeconfig_flags(layout, "controller-manager"),
        f"--service-account-private-key-file={layout.pki / 'sa.key'}",
        f"--root-ca-file={layout.pki / 'ca.crt'}",
        "--use-service-account-credentials=true",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports['kube-controller-manager']}",
        # No endpoint controllers: a pod's IP here is a loopback address (127.164.x.y), which an
        # Endpoints or EndpointSlice object may not hold, so they only retried their failed writes
        # and reported each one as an Event. Nothing reads Services' endpoints on this cluster.
        "--controllers=*,-nodeipam,-service,-route,-cloud-node-lifecycle,-persistentvolume-expander,"
        "-endpoints-controller,-endpointslice-controller,-endpointslice-mirroring-controller",
        "--concurrent-job-syncs=10",
        # The Job controller's client would otherwise hold every Job's status writes to 20/s:
        # with a hundred attempts ending at once that alone is seconds of queueing.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
        "--v=0",
    ]


def kube_scheduler(layout: Layout, bins: Path) -> list[str]:
    return [
        str(bins / "kube-scheduler"),
        *_kubeconfig_flags(layout, "scheduler"),
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={layout.ports['kube-scheduler']}",
        "--v=0",
    ]


def node_agent(layout: Layout) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.cluster.nodeagent",
        "--kubeconfig",
        str(layout.kubeconfig),
        "--state-dir",
        str(layout.root),
    ]


def warm_server(layout: Layout, kind: str) -> list[str]:
    """A warm-start server of the pods' ranks (tests/warm), ended by `down`, not by a process."""
    return [sys.executable, "-m", "tests.warm.server", str(layout.warm / f"{kind}.sock"), kind, "0"]


def pods_env() -> dict[str, str]:
    """What the node agent's pods and the warm-start servers that fork their ranks start with:
    this environment, one OpenMP thread unless it says otherwise (as every test process: idle
    math threads of parallel pods took the cores from each other, and a server with them cannot
    fork safely). The servers refuse a rank whose start-up environment differs from theirs, so
    both come from here, whichever process (`scripts/test.sh`, a test worker) starts them."""
    return {"OMP_NUM_THREADS": "1", **os.environ}


def node_agent_env(layout: Layout, bins: Path) -> dict[str, str]:
    """The agent's pods find this interpreter's tools and the cluster's binaries on PATH, and
    import this checkout, then what the caller's PYTHONPATH names (a checkout beside the one the
    environment was installed from puts its own packages there); their ranks start warm."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{bins}{os.pathsep}{os.environ.get('PATH', '')}"
    python_path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return warm.with_stand_ins({**pods_env(), "PATH": path, "PYTHONPATH": python_path}, layout.warm)
