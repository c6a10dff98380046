"""What "the cluster is ready" means for tests: API up, every node of the agent Ready, default
ServiceAccount present (pods can be admitted)."""

from __future__ import annotations

import time
from typing import Any

from kubernetes import client, config

from tests.cluster.layout import ClusterError, Layout
from tests.cluster.nodeagent.nodes import NODES


def wait_ready(layout: Layout, timeout: float = 60) -> None:
    api = config.new_client_from_config(str(layout.kubeconfig))
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    problem = "not checked"
    while time.monotonic() < deadline:
        try:
            nodes: list[Any] = core.list_node().items
            ready = [
                n.metadata.name
                for n in nodes
                if any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or []))
            ]
            if len(ready) < len(NODES):
                problem = f"nodes ready: {ready}"
            else:
                core.read_namespaced_service_account("default", "default")
                return
        except Exception as exc:  # the API may still be settling
            problem = str(exc).splitlines()[0]
        time.sleep(0.3)
    raise ClusterError(f"cluster not ready after {timeout:.0f}s: {problem} (logs: {layout.logs})")
