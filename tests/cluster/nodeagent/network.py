"""The pods here share the machine's network: no network namespace per pod. A pod's own address
(127.X.Y.Z, state.next_ip) keeps what it serves apart, but torch's rendezvous store listens on
every address at MASTER_PORT, so two multi-process jobs running at once would both listen on
29500 and one would fail (EADDRINUSE). Each rendezvous gets a port of its own instead: the same
for every pod of one attempt (its Job), derived from the attempt, so an agent restart keeps it."""

from __future__ import annotations

import hashlib
from typing import Any

#: Below Linux's ephemeral ports (32768-) and clear of the test clusters' port bases (16380-19467).
RENDEZVOUS_PORTS = range(21000, 29000)
#: The label the Job controller gives its pods (the older spelling too).
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")


def rendezvous_port(namespace: str, job: str, master: str) -> str:
    """The port this machine gives the rendezvous `master` (host:port) of `job` in `namespace`."""
    digest = hashlib.sha256(f"{namespace}/{job}/{master}".encode()).digest()
    return str(RENDEZVOUS_PORTS[int.from_bytes(digest[:4], "big") % len(RENDEZVOUS_PORTS)])


def own_rendezvous(pod: Any, env: dict[str, str]) -> None:
    """Give the pod's MASTER_PORT (when it names one) the port of its attempt's rendezvous."""
    labels = pod.metadata.labels or {}
    job = next((labels[key] for key in JOB_NAME_LABELS if key in labels), pod.metadata.name)
    if "MASTER_PORT" in env:
        master = f"{env.get('MASTER_ADDR', '')}:{env['MASTER_PORT']}"
        env["MASTER_PORT"] = rendezvous_port(pod.metadata.namespace, job, master)
