"""What the agent remembers about the pods it runs, kept on disk under `<state>/agent/` so
that a restarted agent re-adopts running processes instead of orphaning them (and `down`
can still kill them when the agent is gone).

`pods.json` holds one `PodProcess` per running pod, `ip-counter` the last pod IP handed out
(an IP is never reused while the cluster's state lives). One re-entrant lock guards the
records, the hosts entries and the files: the agent's threads (watch, exit reporting,
graceful deletions) all change them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.cluster.nodeagent.hosts import write_hosts
from tests.cluster.nodeagent.log import log


@dataclass(frozen=True)
class AgentDirs:
    """The agent's part of a cluster's state directory."""

    root: Path

    @property
    def agent(self) -> Path:
        return self.root / "agent"

    @property
    def pods(self) -> Path:
        """One directory per pod UID: emptyDirs, exit and termination files, its kubeconfig."""
        return self.agent / "pods"

    @property
    def volumes(self) -> Path:
        """Provisioned PersistentVolumes, `<namespace>/<claim>`."""
        return self.root / "volumes"

    @property
    def logs(self) -> Path:
        return self.root / "logs" / "pods"

    @property
    def state_file(self) -> Path:
        return self.agent / "pods.json"

    @property
    def ip_counter(self) -> Path:
        return self.agent / "ip-counter"

    def create(self) -> None:
        for d in (self.agent, self.pods, self.volumes, self.logs):
            d.mkdir(parents=True, exist_ok=True)


@dataclass
class PodProcess:
    """A pod's main container, running as a local process group (one record in pods.json)."""

    uid: str
    namespace: str
    name: str
    pid: int
    ip: str
    pod_dir: str
    container: str
    exit_file: str
    term_file: str
    log_file: str
    started_at: str
    restart_policy: str = "Never"
    restarts: int = 0
    hosts: list[str] = field(default_factory=list)
    deleting: bool = False
    #: The node the pod is bound to (records written before it was kept have "").
    node: str = ""
    #: Local directory -> volume mount path (termination messages name the mount paths).
    mounts: dict[str, str] = field(default_factory=dict)


class AgentState:
    """The running pods, the pods that ended (never started again), those held, and their hosts lines."""

    def __init__(self, dirs: AgentDirs) -> None:
        self.dirs = dirs
        self.lock = threading.RLock()
        self.running: dict[str, PodProcess] = {}
        self.done: set[str] = set()
        self.hosts: dict[str, list[str]] = {}
        #: Nodes whose Node object is gone (their machines lost): the agent runs nothing there.
        self.lost_nodes: set[str] = set()
        #: The pods that were running on each lost node (reported Failed when it comes back).
        self.lost_pods: dict[str, list[PodProcess]] = {}
        #: Nodes a test silenced (nodes.py): their pods' processes are stopped, nothing is written.
        self.silent_nodes: set[str] = set()
        #: Pods waiting for a Secret or ConfigMap their container's env names: uid -> (namespace,
        #: name, why), tried again until they start or go (in memory: a restarted agent lists them anew).
        self.held: dict[str, tuple[str, str, str, str]] = {}  # uid -> namespace, name, reason, message
        self._ip_counter = 0
        self._load()

    def _load(self) -> None:
        try:
            records = json.loads(self.dirs.state_file.read_text())
        except (OSError, ValueError):
            records = {}
        for uid, rec in records.items():
            self.running[uid] = PodProcess(**rec)
            self.hosts[uid] = rec.get("hosts", [])
        counter = self.dirs.ip_counter
        # Each test cluster (its own port base) hands out pod IPs from its own 127.X block:
        # clusters running side by side once gave two pods the same address and port, and a
        # rendezvous of one job reached a process of another.
        port_base = int(os.environ.get("MPJOB_CLUSTER_PORT_BASE", "16380"))
        self._ip_block = 1 + (port_base // 100) % 250
        self._ip_counter = int(counter.read_text()) if counter.exists() else 0
        if self.running:
            log(f"re-adopting {len(self.running)} pod process(es)")

    def save(self) -> None:
        # Written and renamed under the lock: threads saving at once once raced on the one temp
        # file, and the loser's rename killed the thread that reports pod exits.
        with self.lock:
            data = {uid: asdict(r) for uid, r in self.running.items()}
            tmp = self.dirs.state_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.dirs.state_file)

    def next_ip(self) -> str:
        with self.lock:
            self._ip_counter += 1
            self.dirs.ip_counter.write_text(str(self._ip_counter))
            n = self._ip_counter
        return f"127.{self._ip_block}.{(n // 250) % 250}.{n % 250 + 2}"

    def publish_hosts(self) -> None:
        with self.lock:
            write_hosts(self.dirs.root, self.hosts)

    def set_hosts(self, uid: str, lines: list[str]) -> None:
        with self.lock:
            self.hosts[uid] = lines
            write_hosts(self.dirs.root, self.hosts)

    def retire(self, uid: str) -> bool:
        """Move a running pod to the ended ones and drop its names; False if it was not running."""
        with self.lock:
            if self.running.pop(uid, None) is None:
                return False
            self.done.add(uid)
            self.hosts.pop(uid, None)
            write_hosts(self.dirs.root, self.hosts)
        return True

    def release(self, uid: str) -> None:
        """A held pod that went (deleted, or ended): try it no more, drop its names."""
        with self.lock:
            if self.held.pop(uid, None) is not None and self.hosts.pop(uid, None) is not None:
                write_hosts(self.dirs.root, self.hosts)


def kill_recorded_pods(state_dir: Path) -> list[int]:
    """SIGKILL every process group the agent recorded (used by `down` as a last resort)."""
    state = AgentDirs(state_dir).state_file
    killed: list[int] = []
    try:
        records = json.loads(state.read_text())
    except (OSError, ValueError):
        return killed
    for rec in records.values():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(rec["pid"], signal.SIGKILL)
            killed.append(rec["pid"])
    state.unlink(missing_ok=True)
    write_hosts(state_dir, {})
    return killed
