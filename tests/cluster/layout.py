"""Where one test cluster lives: its state directory, its ports and the PID files of its
processes. The bottom of `tests/cluster/`: it imports nothing from the package, so the
control plane, the node agent and the readiness check can all stand on it.

State lives in one directory (default `.cluster/`, or $MPJOB_CLUSTER_DIR): certificates,
etcd data, PID files, logs and the admin kubeconfig. Ports come from $MPJOB_CLUSTER_PORT_BASE
(default 16380): etcd client +0, etcd peer +1, apiserver +63, controller-manager +77,
scheduler +79, Kueue's webhook +85 and health probe +86. Two clusters coexist when both differ.

Kueue is the one optional component (`kueue.py`): started only when asked for, stopped with the rest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Started in this order; stopped in reverse (the node agent first, so it stops its pods).
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "node-agent")
OPTIONAL_COMPONENTS = ("kueue", "s3")
#: The warm-start servers that fork the pods' ranks and operators (tests/warm): started before the node agent,
#: stopped after it, and not tied to it, so the pods of a restarted agent keep their ranks.
WARM_SERVERS = ("warm-trainer", "warm-frameworks", "warm-cli")
ALL_COMPONENTS = WARM_SERVERS + COMPONENTS + OPTIONAL_COMPONENTS


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
            "kueue-webhook": b + 85,
            "kueue-health": b + 86,
            "s3": b + 87,
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
    def warm(self) -> Path:
        """The warm-start servers' sockets."""
        return self.root / "warm"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def pidfile(self, component: str) -> Path:
        return self.pids / f"{component}.pid"

    def child_pidfile(self, component: str) -> Path:
        """The supervised process itself (`supervise.py`), as opposed to its supervisor."""
        return self.pids / f"{component}.child.pid"


def pid_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie."""
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
    """The components whose recorded process is alive: name -> PID."""
    out = {}
    for component in ALL_COMPONENTS:
        pid = read_pid(layout, component)
        if pid and pid_alive(pid):
            out[component] = pid
    return out
