"""The node agent put together: one API client, the state on disk, and five threads
(node heartbeats, the pod watch, held pods tried again, exit reporting, the volume provisioner)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from kubernetes import client, config

from tests.cluster.nodeagent.hosts import write_hosts
from tests.cluster.nodeagent.log import log
from tests.cluster.nodeagent.nodes import Beat, keep_alive, register_nodes
from tests.cluster.nodeagent.pods import PodLifecycle
from tests.cluster.nodeagent.processes import ProcessRuntime
from tests.cluster.nodeagent.state import AgentDirs, AgentState
from tests.cluster.nodeagent.volumes import ensure_storage_class, provision_claims
from tests.cluster.nodeagent.watch import PodWatch

SHUTDOWN_GRACE_SECONDS = 5


class NodeAgent:
    def __init__(self, kubeconfig: str, state_dir: Path) -> None:
        self.api = config.new_client_from_config(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.coord = client.CoordinationV1Api(self.api)
        self.dirs = AgentDirs(state_dir)
        self.dirs.create()
        self.state = AgentState(self.dirs)
        self.stop = threading.Event()
        self.runtime = ProcessRuntime(self.core, self.dirs.logs)
        self.pods = PodLifecycle(
            self.core,
            state=self.state,
            runtime=self.runtime,
            server=self.api.configuration.host,
            ca=self.api.configuration.ssl_ca_cert,
        )
        self.watch = PodWatch(self.core, pods=self.pods, state=self.state, stop=self.stop)

    def run(self) -> None:
        """Register the nodes, then serve until `stop` is set."""
        register_nodes(self.core, self.coord)
        ensure_storage_class(self.api)
        self.state.publish_hosts()
        loops: list[tuple[Callable[..., None], tuple[object, ...]]] = [
            (keep_alive, (self.core, self.coord, self.stop, self.heard)),
            (self.watch.run, ()),
            (self.watch.retry_held, ()),
            (self.pods.report_exits, (self.stop,)),
            (provision_claims, (self.core, self.dirs.volumes, self.stop)),
        ]
        for target, args in loops:
            threading.Thread(target=target, args=args, daemon=True).start()
        log("node agent running")
        self.stop.wait()

    def heard(self, beat: Beat) -> None:
        """What a heartbeat found: nodes gone, nodes silent, and those that answer again."""
        self.pods.nodes_gone(set(beat.gone))
        for node in self.pods.nodes_silent(beat.silent):
            self.watch.node_back(node)

    def shutdown(self) -> None:
        """Stop every pod process (the cluster is going away) and the hosts block."""
        self.stop.set()
        self.pods.nodes_silent(frozenset())  # stopped processes go on, to be stopped for good
        for rec in list(self.state.running.values()):
            self.runtime.kill(rec, grace=SHUTDOWN_GRACE_SECONDS)
        self.state.running.clear()
        self.state.save()
        write_hosts(self.dirs.root, {})
